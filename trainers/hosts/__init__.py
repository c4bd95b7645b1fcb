"""The several-hosts side of ``streamrec cluster``: one node agent per host, the members it
runs, the generation the agents agree on, the topology, shared storage and peer waits."""
