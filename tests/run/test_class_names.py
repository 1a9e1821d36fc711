"""`run.names.class_names`: a native model's tensors by its family's class names, both ways."""

from quantize.models import get_family
from quantize.run.names import class_names


def test_a_native_name_maps_to_the_class_and_back_and_a_tensor_the_class_lacks_is_left_out():
    names = class_names(get_family("wan"), ["head.modulation", "blocks.0.cam_injector_layer1.weight"])
    assert names.renamed == {"head.modulation": "scale_shift_table"}
    assert names.stored == {"scale_shift_table": "head.modulation"}
    assert names.stacks == {} and names.stacked == {}
