//! The per-group layer-7 limiter (../shared/seeds/network-door-limits.txt, "Approach" and L1).
