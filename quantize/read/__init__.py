"""Reading a source: safetensors headers and components (`checkpoint`), which files form them (`files`), the
tensor source every value is read through (`tensor_source`), SOURCE resolved once (`source`), a folder's layout
and default recipes (`detect`), and file hashes (`hashing`)."""
