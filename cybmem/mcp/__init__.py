"""``cybmem mcp``: one memory root served to agents over the Model Context Protocol, the second front
beside the command line (:mod:`cybmem.mcp.server`). This file imports nothing."""
