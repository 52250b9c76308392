module delayd.example/examples

go 1.19
