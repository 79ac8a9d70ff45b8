"""Run a variant of a model from where it departs from its parent: the nodes whose inputs all come out of the
parent unchanged compute what the parent computes, so a variant that changes one layer (one layer quantized, in the
accuracy-aware search's per-layer cost) needs only that layer and what depends on it, fed the parent's tensors at
that boundary. The parent runs once for a group of variants with those tensors as extra outputs."""

from __future__ import annotations

import copy

import numpy as np


def suffix_nodes(variant, changed_output: str, parent_tensors: set[str]) -> list:
    """The nodes of ``variant`` (an onnx ModelProto) to run from the boundary, in the variant's order: the node that
    writes ``changed_output``, every node that depends on it, and the variant's own nodes (outputs the parent does
    not have: the Q/DQ feeding that node)."""
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(variant.graph.node):
        for t in node.input:
            consumers.setdefault(t, []).append(i)
    start = [i for i, node in enumerate(variant.graph.node) if changed_output in node.output]
    keep, todo = set(start), list(start)
    while todo:
        for t in variant.graph.node[todo.pop()].output:
            for c in consumers.get(t, []):
                if c not in keep:
                    keep.add(c)
                    todo.append(c)
    keep |= {i for i, node in enumerate(variant.graph.node) if not set(node.output) & parent_tensors}  # its own
    return [node for i, node in enumerate(variant.graph.node) if i in keep]


def boundary(variant, nodes: list) -> list[str]:
    """The tensors ``nodes`` read that none of them writes and that are not initializers: the parent's."""
    written = {t for node in nodes for t in node.output}
    inits = {i.name for i in variant.graph.initializer}
    return sorted({t for node in nodes for t in node.input if t and t not in written and t not in inits})


def suffix_model(variant, nodes: list, feeds: dict[str, np.ndarray]):
    """A model of ``nodes`` with the boundary tensors (typed as ``feeds``' arrays) as its inputs and the variant's
    outputs; initializers it does not read are left out."""
    from onnx import helper

    from .graph import prune_initializers

    inputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(a.dtype), None) for t, a in feeds.items()]
    graph = helper.make_graph(nodes, "suffix", inputs, list(variant.graph.output), list(variant.graph.initializer))
    model = helper.make_model(graph, opset_imports=list(variant.opset_import), ir_version=variant.ir_version)
    prune_initializers(model)
    return model


def with_outputs(parent, tensors: list[str]):
    """A copy of ``parent`` that also outputs ``tensors`` (besides its own outputs)."""
    from onnx import helper

    model = copy.deepcopy(parent)
    have = {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    model.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in tensors if t not in have)
    return model
