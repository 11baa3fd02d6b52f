"""Fuzz targets for the sans-IO decoders (``make fuzz``) and the mutations the broker fuzz test reuses."""
