"""The local demo: the whole loop on embedded services. Like ``dags/``, it only wires calls."""
