//! The client key (../shared/DESIGN.md, "Client key").
