"""sharecoord's benchmark: `make bench` (python -m bench). See bench/README.md."""
