//! Rust client for delayd (being written).
