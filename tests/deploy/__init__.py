"""Tests of deploy/: dufs on clusters of local processes, Docker Compose, Kubernetes, SLURM and object storage."""
