//! Helpers for end-to-end tests.
