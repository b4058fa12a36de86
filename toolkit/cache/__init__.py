"""The binary cache: built wheels published as a static index and substituted for a build with the same inputs."""
