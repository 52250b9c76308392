//! delayd-bench (being written).

fn main() {}
