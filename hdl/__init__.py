"""Amaranth HDL of the fabric: FPU, router, processing element, tile and mesh."""
