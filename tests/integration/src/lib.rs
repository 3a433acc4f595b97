//! Integration tests that cross crates live in tests/.
