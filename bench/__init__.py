"""sharecoord's benchmark: `make bench` (python -m bench). README.md's Performance
section says what it measures."""
