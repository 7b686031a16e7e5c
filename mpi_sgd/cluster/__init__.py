"""Running on more than one host: the hostfile formats, the ``mpi-sgd doctor`` preflight, and a
two-host cluster on one machine made of network namespaces (``make netns-cluster``).

``node.sh`` sets up a node (sshd, ssh client, per-cluster keys, hostfile); the Docker cluster
(``docker/``) and the namespace cluster both use it.
"""
