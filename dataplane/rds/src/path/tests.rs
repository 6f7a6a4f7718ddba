//! Path-level tests (placeholder).
