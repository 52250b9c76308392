//! delayd-server
