"""The HTTP transport (docs/api.md): an aiohttp app over a ``server.node.Node``."""
