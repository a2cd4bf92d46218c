"""Ray Serve deployment of aioinfer: engine replicas behind an OpenAI ingress, and the
prefix-affinity request router that picks a replica for each request (an optional extra: needs
``ray[serve]``). Importing this package imports nothing; import its modules by name."""
