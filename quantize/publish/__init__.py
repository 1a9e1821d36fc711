"""Writing and publishing a conversion: `converter` (the `convert` API), `pipeline` (one run's files), `output`
(the output appears all at once), `manifest`, `card`, and `hub` (SOURCE as a repo id, upload)."""
