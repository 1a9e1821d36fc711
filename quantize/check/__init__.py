"""`verify`: integrity, provenance, parity and the forward check of a converted checkpoint."""
