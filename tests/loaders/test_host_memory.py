"""Host buffers: one allocation carved into aligned, disjoint views (the layout pinned memory uses)."""

from __future__ import annotations

import torch

from loaders.host import host_buffer


def test_host_buffer_carves_aligned_disjoint_views_of_the_asked_dtypes_and_shapes():
    specs = [
        (torch.float8_e4m3fn, (5, 3)),
        (torch.float32, (5, 1)),
        (torch.uint8, (0,)),
        (torch.bfloat16, (7,)),
        (torch.float32, ()),
    ]
    views = host_buffer(specs, pin=False, owner=None)
    assert [(v.dtype, tuple(v.shape)) for v in views] == specs
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1  # one allocation
    spans = sorted((v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()) for v in views if v.numel())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert all(v.data_ptr() % 64 == 0 for v in views)
    assert all(not v.float().any() for v in views)  # zeroed
    for i, v in enumerate(views):
        v.fill_(i + 1)
    assert [float(v.float().sum()) for v in views] == [1.0 * 15, 2.0 * 5, 0.0, 4.0 * 7, 5.0]
