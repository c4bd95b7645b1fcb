"""What runs on a cluster member: the command loop (``cluster_main``) and its steps on a
worker context: training and scoring a pass, saves, exports, and what they build on."""
