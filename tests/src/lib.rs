//! door's privileged integration suites live in `tests/tests/`; this library holds what they share.
