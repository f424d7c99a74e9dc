"""The host stack: compiler, runtime backends, MemoryX, SwarmX and the appliance."""
