"""Keep the bundled model's int8 weights int8 when it runs: 3x faster per query, ~100 MB less RAM.

The packaged all-MiniLM-L6-v2 stores each weight matrix as int8 plus a scale per column (per row for the
embedding tables), turned back into float32 by a ``Cast`` and a ``Mul`` in the graph. onnxruntime folds
those at load: every query multiplied with ~45 MB of float32 matrices, reading far more memory than it
computed (3.5 ms of one core for a short message), and the 30,522-word table sat in RAM as 47 MB of
float32 to look up a few rows. :func:`int8_weights` rewrites

- each ``MatMul(x, Mul(Cast(w), s))`` into onnxruntime's ``DynamicQuantizeMatMul(x, w, s)``, which
  quantizes the activations on the fly and multiplies in integers: 1.0 ms per short query, vectors
  within 0.97-0.99 cosine of the float path (so a new vector space id: ``MINILM_ID`` in
  bot/memory/minilm.py);
- each ``Gather(Mul(Cast(w), s), ids)`` into ``Mul(Cast(Gather(w, ids)), Gather(s, ids))``: the same
  numbers, widening only the rows looked up.

Why by hand: the ``onnx`` package would add 33 MB to the install for this one edit. An ONNX file is a
protobuf message, and protobuf (onnxruntime's own dependency) parses it with the few fields of the schema
declared below; every field left out (attributes, value infos, docs) is kept as an unknown field and
written back byte for byte.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

# The subset of onnx.proto (proto2) the rewrite reads or writes: (message, field, number, type, label), the
# type and label as named in protobuf's FieldDescriptorProto. protobuf itself is imported when a model is
# rewritten (2.5 MiB): a bot without the local model never does.
_SCHEMA: tuple[tuple[str, str, int, str, str], ...] = (
    ("OperatorSetIdProto", "domain", 1, "TYPE_STRING", "LABEL_OPTIONAL"),
    ("OperatorSetIdProto", "version", 2, "TYPE_INT64", "LABEL_OPTIONAL"),
    ("TensorProto", "dims", 1, "TYPE_INT64", "LABEL_REPEATED"),
    ("TensorProto", "name", 8, "TYPE_STRING", "LABEL_OPTIONAL"),
    ("NodeProto", "input", 1, "TYPE_STRING", "LABEL_REPEATED"),
    ("NodeProto", "output", 2, "TYPE_STRING", "LABEL_REPEATED"),
    ("NodeProto", "name", 3, "TYPE_STRING", "LABEL_OPTIONAL"),
    ("NodeProto", "attribute", 5, "TYPE_MESSAGE", "LABEL_REPEATED"),
    ("AttributeProto", "name", 1, "TYPE_STRING", "LABEL_OPTIONAL"),
    ("AttributeProto", "i", 3, "TYPE_INT64", "LABEL_OPTIONAL"),
    ("NodeProto", "op_type", 4, "TYPE_STRING", "LABEL_OPTIONAL"),
    ("NodeProto", "domain", 7, "TYPE_STRING", "LABEL_OPTIONAL"),
    ("GraphProto", "node", 1, "TYPE_MESSAGE", "LABEL_REPEATED"),
    ("GraphProto", "initializer", 5, "TYPE_MESSAGE", "LABEL_REPEATED"),
    ("ModelProto", "graph", 7, "TYPE_MESSAGE", "LABEL_OPTIONAL"),
    ("ModelProto", "opset_import", 8, "TYPE_MESSAGE", "LABEL_REPEATED"),
)
_MESSAGE_FIELDS = {"node": "NodeProto", "initializer": "TensorProto", "graph": "GraphProto",
                   "opset_import": "OperatorSetIdProto", "attribute": "AttributeProto"}  # fmt: skip
_MS_DOMAIN = "com.microsoft"  # onnxruntime's contrib operators, DynamicQuantizeMatMul among them


@cache
def _model_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field_type = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="membot_onnx_subset.proto", package="membot_onnx")
    file.syntax = "proto2"
    messages: dict[str, descriptor_pb2.DescriptorProto] = {}
    for message, field, number, kind, label in _SCHEMA:
        if message not in messages:
            messages[message] = file.message_type.add(name=message)
        spec = messages[message].field.add(
            name=field, number=number, type=getattr(field_type, kind), label=getattr(field_type, label)
        )
        if kind == "TYPE_MESSAGE":
            spec.type_name = f".membot_onnx.{_MESSAGE_FIELDS[field]}"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("membot_onnx.ModelProto"))


def int8_weights(model: bytes) -> tuple[bytes, int]:
    """``model`` with its int8 weights kept int8 (see the module doc), and how many uses were rewritten.

    A use is rewritten only when it is exactly ``Mul(Cast(w), s)`` of two initializers feeding one
    ``MatMul`` (as its weights, ``s`` one scale per column) or one ``Gather`` (as its table, ``s`` one
    scale per row); everything else (attention's products of activations) is left as it was.
    """
    proto = _model_class()()
    proto.ParseFromString(model)
    graph = proto.graph
    nodes = list(graph.node)
    initializers = {t.name: t for t in graph.initializer}
    made_by = {out: index for index, node in enumerate(nodes) for out in node.output}
    uses = Counter(name for node in nodes for name in node.input)

    def widened(name: str) -> tuple[int, int, Any, Any] | None:
        """``name`` as (Cast index, Mul index, int8 weight, scale) if it is a widened int8 initializer."""
        m = made_by.get(name)
        if m is None or nodes[m].op_type != "Mul" or uses[name] != 1 or len(nodes[m].input) != 2:
            return None
        c = made_by.get(nodes[m].input[0])
        if c is None or nodes[c].op_type != "Cast":
            return None
        weight, scale = initializers.get(nodes[c].input[0]), initializers.get(nodes[m].input[1])
        if weight is None or scale is None or len(weight.dims) != 2:
            return None
        if uses[weight.name] != 1 or uses[scale.name] != 1:  # shared: rewriting it would change another
            return None
        return c, m, weight, scale

    replaced: dict[int, list[Any]] = {}  # a Gather's index -> the nodes that take its place, in order
    dropped: set[int] = set()  # the Casts and Muls folded into a MatMul or moved after a Gather
    for index, node in enumerate(nodes):
        if node.domain or len(node.input) != 2:
            continue
        if node.op_type == "MatMul" and (found := widened(node.input[1])) is not None:
            c, m, weight, scale = found
            if [d for d in scale.dims if d != 1] != [weight.dims[1]]:
                continue
            del scale.dims[:]
            scale.dims.append(weight.dims[1])  # per-column scales as the 1-D tensor the operator takes
            x = node.input[0]
            del node.input[:]
            node.input.extend([x, weight.name, scale.name])
            node.op_type, node.domain = "DynamicQuantizeMatMul", _MS_DOMAIN
            dropped.update((c, m))
        elif node.op_type == "Gather" and (found := widened(node.input[0])) is not None:
            c, m, weight, scale = found
            if list(scale.dims) != [weight.dims[0], 1] or any(
                a.name == "axis" and a.i for a in node.attribute
            ):
                continue
            cast, mul, (out,), ids = nodes[c], nodes[m], node.output, node.input[1]
            node.input[0], node.output[0], cast.input[0] = weight.name, f"{out}__int8", f"{out}__int8"
            scales = type(node)(op_type="Gather", name=f"{node.name}__scale", output=[f"{out}__scale"])
            scales.input.extend([scale.name, ids])
            del mul.input[:]
            mul.input.extend([cast.output[0], f"{out}__scale"])
            mul.output[0] = out
            replaced[index] = [node, scales, cast, mul]
            dropped.update((c, m))
    if not dropped:
        return model, 0
    order = [n for i, node in enumerate(nodes) if i not in dropped for n in replaced.get(i, [node])]
    copies = [type(node)() for node in order]  # copied out before the list they live in is cleared
    for copy, node in zip(copies, order, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    if not any(o.domain == _MS_DOMAIN for o in proto.opset_import):
        proto.opset_import.add(domain=_MS_DOMAIN, version=1)
    return proto.SerializeToString(), len(dropped) // 2
