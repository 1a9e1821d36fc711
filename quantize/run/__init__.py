"""Running a component as a model, streamed layer by layer: `forward` (verify --forward) and `sensitivity`."""
