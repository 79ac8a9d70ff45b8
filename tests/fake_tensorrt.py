"""A RECORDING FAKE of the TensorRT Python API (10.x / 11.x) and TensorRT-RTX, for CPU CI.

It is not TensorRT and proves nothing about TensorRT's behaviour: it checks that trtc calls the documented API
(../shared/reference/api-facts.md, TensorRT's Python API docs) in the documented order with the right arguments,
and it gives our code a network to inspect. Its "parser" reads the real ONNX file with the onnx package and turns
each node into a layer with the node's name, a layer type and the graph's tensor types, so that profiles, dynamic
dimensions and the precision check run on real models. Every call is appended to ``module.calls``.
"""

from __future__ import annotations

import enum
import importlib.machinery
import types


class _DType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    INT64 = 8


_ONNX_TO_DTYPE = {1: _DType.FLOAT, 10: _DType.HALF, 3: _DType.INT8, 6: _DType.INT32, 7: _DType.INT64, 9: _DType.BOOL,
                  2: _DType.UINT8}
_NO_LAYER = {"Dropout"}  # inference: the ONNX parser passes the input through, no layer
_LAYER_TYPES = {"Conv": "CONVOLUTION", "ConvTranspose": "DECONVOLUTION", "Gemm": "MATRIX_MULTIPLY",
                "MatMul": "MATRIX_MULTIPLY", "QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE",
                "Cast": "CAST", "Relu": "ACTIVATION", "Clip": "ACTIVATION", "Add": "ELEMENTWISE",
                "Reshape": "SHUFFLE", "ReduceMean": "REDUCE", "Softmax": "SOFTMAX"}


class _LayerType(enum.Enum):
    CONVOLUTION = 0
    DECONVOLUTION = 1
    MATRIX_MULTIPLY = 2
    QUANTIZE = 3
    DEQUANTIZE = 4
    CAST = 5
    ACTIVATION = 6
    ELEMENTWISE = 7
    SHUFFLE = 8
    REDUCE = 9
    SOFTMAX = 10
    IDENTITY = 11  # every other op (a real LayerType member; the fake needs no finer type)


class _Tensor:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype


class _Layer:
    def __init__(self, name, kind, inputs, outputs):
        self.name, self.type = name, kind
        self._in, self._out = inputs, outputs
        self.num_inputs, self.num_outputs = len(inputs), len(outputs)

    def get_input(self, index):
        return self._in[index]

    def get_output(self, index):
        return self._out[index]


class _IOMode(enum.Enum):
    INPUT = 0
    OUTPUT = 1


FAILURES = ("set_input_shape", "add_optimization_profile", "set_timing_cache", "execute_async_v3",
            "create_execution_context", "create_runtime_config")
_VC_MARK = b"|version-compatible"


def make(version: str = "10.13.0", rtx: bool = False, *, unsupported: tuple[str, ...] = (),
         build_fails_with: str | None = None, force_dtype: str | None = None, plan: bytes = b"FAKE-PLAN\x00\x01",
         engine_io: list | None = None, fail: tuple[str, ...] = (), compute=None, engine_info: dict | None = None):
    """A fresh fake module. ``unsupported``: ONNX op types the parser rejects; ``build_fails_with``: the error the
    builder logs before returning None; ``force_dtype``: pretend every layer input is this type (to exercise the
    precision check); ``plan``: the bytes build_serialized_network returns; ``engine_io``: [(name, "INPUT" or
    "OUTPUT", dtype name, shape with -1 for the batch)] makes deserialize_cuda_engine return an engine with these
    I/O tensors whose execution contexts record their calls (and compute nothing); ``fail``: names from
    ``FAILURES`` that report failure the way TensorRT does (False, -1 or None); ``compute``: a function
    {input name: numpy array} -> {output name: numpy array} that execute_async_v3 runs on the bound buffers (host
    memory behind tests/fake_cupy.py's arrays), so a plan can give real answers (e.g. the ONNX run by ORT on CPU);
    ``engine_info``: what the engine's inspector answers to get_engine_information(JSON) (see :func:`inspector_info`).

    Strict: the classes are also exposed under TensorRT's names (``IBuilderConfig``, ``ICudaEngine``...), have only
    members the real bindings have (tests/unit/test_trt_real_bindings.py checks that against the real wheels), and
    setting an unknown builder-config attribute raises AttributeError as pybind11 does. A plan built with
    VERSION_COMPATIBLE only deserializes after ``Runtime.engine_host_code_allowed = True``, as in TensorRT.
    ONNX Dropout nodes add no layer, and Gemm with a bias
    adds two (a matrix multiply and an elementwise add), so layers do not map one to one onto nodes."""
    unknown = set(fail) - set(FAILURES)
    if unknown:
        raise ValueError(f"fake_tensorrt: unknown failures {sorted(unknown)}")
    m = types.ModuleType("tensorrt_rtx" if rtx else "tensorrt")
    m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None)
    m.__version__ = version
    m.FAKE = True
    calls: list[tuple] = []
    m.calls = calls

    class ILogger:
        class Severity(enum.IntEnum):
            INTERNAL_ERROR = 0
            ERROR = 1
            WARNING = 2
            INFO = 3
            VERBOSE = 4

        def __init__(self):
            calls.append(("ILogger.__init__",))

    class IProgressMonitor:
        def __init__(self):
            calls.append(("IProgressMonitor.__init__",))

    m.ILogger, m.IProgressMonitor = ILogger, IProgressMonitor
    m.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 1})
    m.MemoryPoolType = enum.Enum("MemoryPoolType", {"WORKSPACE": 0, "TACTIC_SHARED_MEMORY": 1})
    m.ProfilingVerbosity = enum.Enum("ProfilingVerbosity", {"LAYER_NAMES_ONLY": 0, "NONE": 1, "DETAILED": 2})
    m.BuilderFlag = enum.Enum("BuilderFlag", {"VERSION_COMPATIBLE": 0, "EXCLUDE_LEAN_RUNTIME": 1})
    m.HardwareCompatibilityLevel = enum.Enum("HardwareCompatibilityLevel",
                                             {"NONE": 0, "AMPERE_PLUS": 1, "SAME_COMPUTE_CAPABILITY": 2})
    m.LayerInformationFormat = enum.Enum("LayerInformationFormat", {"ONELINE": 0, "JSON": 1})
    m.DataType = _DType
    m.LayerType = _LayerType
    if rtx:
        m.ComputeCapability = enum.Enum("ComputeCapability", {"NONE": 0, "CURRENT": 1, "SM75": 2, "SM80": 3,
                                                              "SM86": 4, "SM89": 5, "SM120": 6, "SM121": 7})

    class Network:
        def __init__(self, flags):
            self._flags = flags
            self._inputs, self._outputs, self._layers = [], [], []

        num_inputs = property(lambda self: len(self._inputs))
        num_outputs = property(lambda self: len(self._outputs))
        num_layers = property(lambda self: len(self._layers))

        def get_input(self, index):
            return self._inputs[index]

        def get_output(self, index):
            return self._outputs[index]

        def get_layer(self, index):
            return self._layers[index]

        def get_flag(self, flag):
            return bool(self._flags & (1 << int(flag.value)))

    class ParserError:
        def __init__(self, node, name, op, desc):
            self._node, self._name, self._op, self._desc = node, name, op, desc

        def code(self):
            return 8

        def desc(self):
            return self._desc

        def node(self):
            return self._node

        def node_name(self):
            return self._name

        def node_operator(self):
            return self._op

    class OnnxParser:
        def __init__(self, network, logger):
            calls.append(("OnnxParser", type(network).__name__))
            self._network, self._errors = network, []

        num_errors = property(lambda self: len(self._errors))

        def get_error(self, index):
            return self._errors[index]

        def parse_from_file(self, path):
            calls.append(("OnnxParser.parse_from_file", path))
            import onnx

            model = onnx.shape_inference.infer_shapes(onnx.load(path))
            g = model.graph
            for idx, n in enumerate(g.node):
                if n.op_type in unsupported:
                    self._errors.append(ParserError(idx, n.name, n.op_type,
                                                   f"No importer registered for op: {n.op_type}"))
            if self._errors:
                return False
            types_ = {i.name: i.data_type for i in g.initializer}
            for vi in list(g.input) + list(g.value_info) + list(g.output):
                types_[vi.name] = vi.type.tensor_type.elem_type

            def tensor(name, shape=()):
                dt = _DType[force_dtype] if force_dtype else _ONNX_TO_DTYPE.get(types_.get(name, 1), _DType.FLOAT)
                return _Tensor(name, shape, dt)

            inits = {i.name for i in g.initializer}
            for vi in g.input:
                if vi.name in inits:
                    continue
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
                self._network._inputs.append(tensor(vi.name, dims))
            for vi in g.output:
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
                self._network._outputs.append(tensor(vi.name, dims))
            for n in g.node:
                if n.op_type in _NO_LAYER:
                    continue
                name = n.name or n.output[0]
                ins, outs = [tensor(i) for i in n.input if i], [tensor(o) for o in n.output]
                if n.op_type == "Gemm" and len(ins) == 3:  # TensorRT: matrix multiply, then the bias added
                    mid = _Tensor(name + "_mm", (), outs[0].dtype)
                    self._network._layers.append(_Layer(name, _LayerType.MATRIX_MULTIPLY, ins[:2], [mid]))
                    self._network._layers.append(_Layer(name + "_bias", _LayerType.ELEMENTWISE, [mid, ins[2]], outs))
                    continue
                kind = _LayerType[_LAYER_TYPES.get(n.op_type, "IDENTITY")]
                self._network._layers.append(_Layer(name, kind, ins, outs))
            return True

    class Profile:
        def set_shape(self, input, min, opt, max):  # noqa: A002 - TensorRT's parameter names
            name, mn, mx = input, min, max
            calls.append(("IOptimizationProfile.set_shape", name, tuple(mn), tuple(opt), tuple(mx)))

    class TimingCache:
        def __init__(self, data):
            self._data = bytes(data)

        def serialize(self):
            return b"TC:" + self._data[-16:]

    class Config:
        _SETTABLE = ("progress_monitor", "profiling_verbosity", "builder_optimization_level",
                     "hardware_compatibility_level", "num_compute_capabilities")
        progress_monitor = profiling_verbosity = builder_optimization_level = None
        hardware_compatibility_level = num_compute_capabilities = None

        def __init__(self):
            self._cache = None
            self._flags = set()

        def __setattr__(self, key, value):
            if not key.startswith("_"):
                if key not in self._SETTABLE:  # pybind11 classes refuse unknown attributes
                    raise AttributeError(f"'tensorrt.IBuilderConfig' object has no attribute '{key}'")
                calls.append(("IBuilderConfig." + key, value))
            object.__setattr__(self, key, value)

        def set_memory_pool_limit(self, pool, size):
            calls.append(("IBuilderConfig.set_memory_pool_limit", pool.name, size))

        def add_optimization_profile(self, profile):
            calls.append(("IBuilderConfig.add_optimization_profile",))
            return -1 if "add_optimization_profile" in fail else 0

        def set_flag(self, flag):
            calls.append(("IBuilderConfig.set_flag", flag.name))
            self._flags.add(flag.name)

        def create_timing_cache(self, data):
            calls.append(("IBuilderConfig.create_timing_cache", bytes(data)))
            return TimingCache(data)

        def set_timing_cache(self, cache, ignore_mismatch):
            calls.append(("IBuilderConfig.set_timing_cache", ignore_mismatch))
            if "set_timing_cache" in fail and not ignore_mismatch:
                return False
            self._cache = cache
            return True

        def get_timing_cache(self):
            return self._cache

        def set_compute_capability(self, compute_capability, index):
            calls.append(("IBuilderConfig.set_compute_capability", compute_capability.name, index))

    if not rtx:
        del Config.set_compute_capability, Config.num_compute_capabilities  # TensorRT-RTX only
        Config._SETTABLE = tuple(k for k in Config._SETTABLE if k != "num_compute_capabilities")

    class Builder:
        def __init__(self, logger):
            calls.append(("Builder",))
            self._logger = logger

        def create_network(self, flags=0):
            calls.append(("Builder.create_network", flags))
            return Network(flags)

        def create_builder_config(self):
            calls.append(("Builder.create_builder_config",))
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            calls.append(("Builder.build_serialized_network",))
            if build_fails_with:
                self._logger.log(ILogger.Severity.ERROR, build_fails_with)
                return None
            if config.progress_monitor is not None:
                mon = config.progress_monitor
                mon.phase_start("Building engine", None, 2)
                mon.step_complete("Building engine", 0)
                mon.phase_finish("Building engine")
            return plan + (_VC_MARK if "VERSION_COMPATIBLE" in config._flags else b"")

    class Runtime:
        engine_host_code_allowed = False

        def __init__(self, logger):
            calls.append(("Runtime",))
            self._logger = logger

        def __setattr__(self, key, value):
            if not key.startswith("_"):
                if key != "engine_host_code_allowed":
                    raise AttributeError(f"'tensorrt.Runtime' object has no attribute '{key}'")
                calls.append(("Runtime." + key, value))
            object.__setattr__(self, key, value)

        def deserialize_cuda_engine(self, serialized_engine):
            data = bytes(serialized_engine)
            calls.append(("Runtime.deserialize_cuda_engine", len(data)))
            if data.endswith(_VC_MARK) and not self.engine_host_code_allowed:
                self._logger.log(ILogger.Severity.ERROR, "IRuntime::deserializeCudaEngine: Error Code 1: Serialization "
                                 "(version-compatible engine needs engine host code: set engine_host_code_allowed)")
                return None
            if engine_io is None:
                self._logger.log(ILogger.Severity.ERROR, "fake: no engine can be deserialized")
                return None
            return Engine()

    class Context:
        """Records a race when a thread uses the context between another thread's set_input_shape and its enqueue
        (TensorRT contexts are not thread-safe)."""

        def __init__(self, n):
            self._n, self._shapes, self._owner = n, {}, None

        def _use(self):
            import threading
            import time

            me = threading.get_ident()
            if self._owner not in (None, me):
                calls.append(("ctx.race", self._n))
            self._owner = me
            time.sleep(0)  # let another thread in, as a real enqueue would

        def set_input_shape(self, name, shape):
            self._use()
            calls.append(("ctx.set_input_shape", self._n, name, tuple(shape)))
            if "set_input_shape" in fail:
                return False
            self._shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name):
            batch = next(iter(self._shapes.values()))[0]
            return tuple(batch if d == -1 else d for d in io[name][2])

        def set_tensor_address(self, name, memory):
            self._use()
            calls.append(("ctx.set_tensor_address", self._n, name, int(memory)))
            self._addresses = {**getattr(self, "_addresses", {}), name: int(memory)}
            return True

        def _compute(self):
            import ctypes

            import numpy as np

            def view(name, shape):
                dt = np.dtype(io[name][1])
                n = int(np.prod(shape)) * dt.itemsize
                buf = (ctypes.c_char * n).from_address(self._addresses[name])
                return np.frombuffer(buf, dtype=dt).reshape(shape)

            feeds = {n: view(n, self._shapes[n]).copy() for n in io if io[n][0] == "INPUT"}
            for name, value in compute(feeds).items():
                view(name, self.get_tensor_shape(name))[...] = value

        def execute_async_v3(self, stream_handle):
            self._use()
            calls.append(("ctx.execute_async_v3", self._n, int(stream_handle)))
            self._owner = None  # enqueued: the context may be used by another thread now
            if compute is not None and "execute_async_v3" not in fail:
                self._compute()
            return "execute_async_v3" not in fail

    class RuntimeConfig:
        def __init__(self):
            self._strategy = None

        def __setattr__(self, key, value):
            if not key.startswith("_") and key != "cuda_graph_strategy":
                raise AttributeError(f"'tensorrt_rtx.IRuntimeConfig' object has no attribute '{key}'")
            if not key.startswith("_"):
                calls.append(("IRuntimeConfig." + key, getattr(value, "name", value)))
            object.__setattr__(self, key, value)

        cuda_graph_strategy = None

    io = {name: (mode, dtype, tuple(shape)) for name, mode, dtype, shape in (engine_io or [])}

    class EngineInspector:
        """TensorRT's IEngineInspector (bound as ``EngineInspector``): the built engine's layers as text."""

        execution_context = None

        def get_engine_information(self, format):  # noqa: A002 - TensorRT's parameter name
            import json

            calls.append(("EngineInspector.get_engine_information", format.name))
            if format.name != "JSON":
                return "\n".join(str(layer.get("Name", layer)) if isinstance(layer, dict) else str(layer)
                                 for layer in (engine_info or {}).get("Layers", []))
            return json.dumps(engine_info if engine_info is not None else {"Layers": []})

        def get_layer_information(self, layer_index, format):  # noqa: A002 - TensorRT's parameter names
            import json

            calls.append(("EngineInspector.get_layer_information", layer_index, format.name))
            return json.dumps((engine_info or {}).get("Layers", [])[layer_index])

    class Engine:
        num_io_tensors = len(io)
        num_layers = len((engine_info or {}).get("Layers", []))

        def create_engine_inspector(self):
            calls.append(("engine.create_engine_inspector",))
            return EngineInspector()

        def __init__(self):
            self._contexts = 0

        def get_tensor_name(self, i):
            return list(io)[i]

        def get_tensor_mode(self, name):
            return _IOMode[io[name][0]]

        def get_tensor_dtype(self, name):
            return {"float32": _DType.FLOAT, "float16": _DType.HALF}[io[name][1]]

        def get_tensor_shape(self, name):
            return io[name][2]

        def create_execution_context(self, *runtime_config):
            calls.append(("engine.create_execution_context", self._contexts))
            if "create_execution_context" in fail:
                return None
            self._contexts += 1
            return Context(self._contexts - 1)

        def create_runtime_config(self):
            calls.append(("engine.create_runtime_config",))
            return None if "create_runtime_config" in fail else RuntimeConfig()

    if not rtx:
        del Engine.create_runtime_config  # TensorRT 10/11 have no IRuntimeConfig here
    else:
        m.CudaGraphStrategy = enum.Enum("CudaGraphStrategy", {"DISABLED": 0, "WHOLE_GRAPH_CAPTURE": 1})
        m.IRuntimeConfig = RuntimeConfig

    m.TensorIOMode = _IOMode
    m.Builder, m.OnnxParser, m.Runtime = Builder, OnnxParser, Runtime
    # TensorRT's own names for the classes its factories return (what the real-bindings test compares)
    m.IBuilderConfig, m.INetworkDefinition, m.IOptimizationProfile, m.ITimingCache = Config, Network, Profile, \
        TimingCache
    m.ICudaEngine, m.IExecutionContext, m.ParserError, m.ITensor, m.ILayer = Engine, Context, ParserError, \
        _Tensor, _Layer
    m.EngineInspector = EngineInspector
    return m


def runtime_only(fake, flavor: str = "lean"):
    """Turn a TensorRT 10/11 fake into its lean (``tensorrt_lean``) or dispatch runtime: no builder, no parser."""
    fake.__name__ = f"tensorrt_{flavor}"
    fake.__spec__ = importlib.machinery.ModuleSpec(fake.__name__, None)
    for name in ("Builder", "OnnxParser", "IBuilderConfig", "INetworkDefinition", "IOptimizationProfile",
                 "ITimingCache", "ParserError", "ITensor", "ILayer", "NetworkDefinitionCreationFlag", "LayerType",
                 "IProgressMonitor", "EngineInspector"):
        if hasattr(fake, name):
            delattr(fake, name)
    return fake


_FUSED_AFTER = {"Relu", "Clip", "Sigmoid", "Mul", "Add", "BatchNormalization"}  # pointwise: fused into a producer
_FOLDED = {"Constant", "Shape", "Gather", "Unsqueeze", "Concat", "Slice"}  # shape arithmetic: folded at build time
_KERNEL = {"Conv": "CaskConvolution", "Gemm": "CaskGemmMatrixMultiply", "MatMul": "CaskGemmMatrixMultiply",
           "ReduceMean": "CaskPooling", "GlobalAveragePool": "CaskPooling", "Softmax": "CaskSoftMaxV2",
           "Reshape": "NoOp", "Flatten": "NoOp"}


def inspector_info(onnx_path, version: str = "10", detailed: bool = True, input_type: str = "FP32") -> dict:
    """What TensorRT's inspector answers for a plan built from ``onnx_path``, in the form TensorRT ``version`` writes
    (10: one "Format/Datatype" string; 11: split "Format" and "Datatype"), made up in the documented shape: a
    reformatting copy of the input first (named and typed as TensorRT names its copies, with no ONNX node), then a
    layer per computing node, a pointwise node fused into the layer before it (named ``a + b``, Metadata
    ``[ONNX Layer: a]\x1f[ONNX Layer: b]``), shape arithmetic folded away (no layer). ``detailed=False``: what a
    plan built without DETAILED profiling verbosity gives (names only). Computing layers take ``input_type``."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    word = {"FP32": ("Row major linear FP32", "kLINEAR", "FLOAT"), "FP16": ("Channel major FP16 format", "kHWC8",
                                                                            "HALF"),
            "INT8": ("Thirty-two wide channel vectorized row major Int8 format", "kCHW32", "INT8")}

    def tensor(name, kind):
        text, fmt, dtype = word[kind]
        return {"Name": name, "Format/Datatype": text} if version.startswith("10") else \
            {"Name": name, "Format": fmt, "Datatype": dtype}

    first = model.graph.input[0].name
    constant = {i.name for i in model.graph.initializer}
    computing = []
    for n in model.graph.node:  # a node of constants only is folded at build time (as shape arithmetic is)
        if n.op_type in _FOLDED or all(i in constant for i in n.input if i):
            constant.update(n.output)
        else:
            computing.append(n)
    layers = [{"Name": f"Reformatting CopyNode for Input Tensor 0 to {computing[0].name}",
               "LayerType": "Reformat", "Inputs": [tensor(first, "FP32")],
               "Outputs": [tensor(first + " copy", input_type)], "Metadata": ""}]
    for n in computing:
        last = layers[-1]
        if n.op_type in _FUSED_AFTER and last["LayerType"] != "Reformat" and last["Outputs"] and \
                last["Outputs"][0]["Name"] in n.input:
            last["Name"] += f" + {n.name}"
            last["Metadata"] += f"\x1f[ONNX Layer: {n.name}]"
            last["Outputs"] = [tensor(n.output[0], input_type)]
            continue
        layers.append({"Name": n.name, "LayerType": _KERNEL.get(n.op_type, "PointWiseV2"),
                       "Inputs": [tensor(n.input[0], input_type)], "Outputs": [tensor(n.output[0], input_type)],
                       "Metadata": f"[ONNX Layer: {n.name}]"})
    if not detailed:
        return {"Layers": [layer["Name"] for layer in layers], "Bindings": [first, model.graph.output[0].name]}
    io = "Bindings" if version.startswith("10") else "I/O Tensors"
    return {"Layers": layers, io: [first, model.graph.output[0].name]}


def install(monkeypatch, fake, gpu: dict | None = None):
    """Make ``fake`` importable under both of its names and pretend this machine has ``gpu``."""
    import sys

    names = (fake.__name__, fake.__name__ + "_bindings")
    monkeypatch.setitem(sys.modules, names[0], fake)
    for other in ("tensorrt", "tensorrt_bindings", "tensorrt_rtx", "tensorrt_rtx_bindings", "tensorrt_lean",
                  "tensorrt_lean_bindings", "tensorrt_dispatch", "tensorrt_dispatch_bindings"):
        if other != names[0]:
            monkeypatch.setitem(sys.modules, other, None)  # import fails: only the fake is "installed"
    import engines._gpu
    import engines.tensorrt_engine
    import toolchain.build
    import toolchain.inspect_artifact

    for mod in (toolchain.build, engines.tensorrt_engine, toolchain.inspect_artifact):
        monkeypatch.setattr(mod, "gpu_device", lambda index=0: gpu)
    return fake


H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "580.159.04", "cuda": "13.0",
        "index": 0}
RTX4090 = {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "driver": "580.1", "cuda": "13.0",
           "index": 0}


def mnist_plan(monkeypatch, mnist, folder):
    """The real MNIST CNN copied to ``folder``/m.onnx and built into m.plan by the fake TensorRT 10.13 (H100): (an
    ONNX Runtime CPU session of the model, its input name, its output name, the plan's engine_io for :func:`make`),
    for tests whose fake plan then computes with that session."""
    import shutil

    import onnxruntime as ort

    from toolchain.build import build_engine

    model = mnist[0]
    shutil.copy(model, folder / "m.onnx")
    install(monkeypatch, make("10.13.0"), H100)
    build_engine(folder / "m.onnx")
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    i_name, o_name = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    io = [(i_name, "INPUT", "float32", (1, 1, 28, 28)), (o_name, "OUTPUT", "float32", (1, 10))]
    return sess, i_name, o_name, io
