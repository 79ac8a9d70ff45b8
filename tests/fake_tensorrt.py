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
    OTHER = 11


class _Tensor:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype


class _Layer:
    def __init__(self, name, kind, inputs, outputs):
        self.name, self.type = name, kind
        self._in, self._out = inputs, outputs
        self.num_inputs, self.num_outputs = len(inputs), len(outputs)

    def get_input(self, i):
        return self._in[i]

    def get_output(self, i):
        return self._out[i]


class _IOMode(enum.Enum):
    INPUT = 0
    OUTPUT = 1


def make(version: str = "10.13.0", rtx: bool = False, *, unsupported: tuple[str, ...] = (),
         build_fails_with: str | None = None, force_dtype: str | None = None, plan: bytes = b"FAKE-PLAN\x00\x01",
         engine_io: list | None = None):
    """A fresh fake module. ``unsupported``: ONNX op types the parser rejects; ``build_fails_with``: the error the
    builder logs before returning None; ``force_dtype``: pretend every layer input is this type (to exercise the
    precision check); ``plan``: the bytes build_serialized_network returns; ``engine_io``: [(name, "INPUT" or
    "OUTPUT", dtype name, shape with -1 for the batch)] makes deserialize_cuda_engine return an engine with these
    I/O tensors whose execution contexts record their calls (and compute nothing)."""
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
            self.flags = flags
            self.inputs, self.outputs, self.layers = [], [], []

        num_inputs = property(lambda self: len(self.inputs))
        num_outputs = property(lambda self: len(self.outputs))
        num_layers = property(lambda self: len(self.layers))

        def get_input(self, i):
            return self.inputs[i]

        def get_output(self, i):
            return self.outputs[i]

        def get_layer(self, i):
            return self.layers[i]

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
            self.network, self.errors = network, []

        num_errors = property(lambda self: len(self.errors))

        def get_error(self, i):
            return self.errors[i]

        def parse_from_file(self, path):
            calls.append(("OnnxParser.parse_from_file", path))
            import onnx

            model = onnx.shape_inference.infer_shapes(onnx.load(path))
            g = model.graph
            for idx, n in enumerate(g.node):
                if n.op_type in unsupported:
                    self.errors.append(ParserError(idx, n.name, n.op_type,
                                                   f"No importer registered for op: {n.op_type}"))
            if self.errors:
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
                self.network.inputs.append(tensor(vi.name, dims))
            for vi in g.output:
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
                self.network.outputs.append(tensor(vi.name, dims))
            for n in g.node:
                kind = _LayerType[_LAYER_TYPES.get(n.op_type, "OTHER")]
                self.network.layers.append(_Layer(n.name or n.output[0], kind,
                                                  [tensor(i) for i in n.input if i], [tensor(o) for o in n.output]))
            return True

    class Profile:
        def set_shape(self, name, mn, opt, mx):
            calls.append(("IOptimizationProfile.set_shape", name, tuple(mn), tuple(opt), tuple(mx)))

    class TimingCache:
        def __init__(self, data):
            self.data = bytes(data)

        def serialize(self):
            return b"TC:" + self.data[-16:]

    class Config:
        def __init__(self):
            self._cache = None
            self.progress_monitor = None

        def __setattr__(self, key, value):
            if not key.startswith("_"):
                calls.append(("IBuilderConfig." + key, value))
            object.__setattr__(self, key, value)

        def set_memory_pool_limit(self, pool, size):
            calls.append(("IBuilderConfig.set_memory_pool_limit", pool.name, size))

        def add_optimization_profile(self, p):
            calls.append(("IBuilderConfig.add_optimization_profile",))
            return 0

        def set_flag(self, flag):
            calls.append(("IBuilderConfig.set_flag", flag.name))

        def create_timing_cache(self, data):
            calls.append(("IBuilderConfig.create_timing_cache", bytes(data)))
            return TimingCache(data)

        def set_timing_cache(self, cache, ignore_mismatch):
            calls.append(("IBuilderConfig.set_timing_cache", ignore_mismatch))
            self._cache = cache
            return True

        def get_timing_cache(self):
            return self._cache

        def set_compute_capability(self, cc, index):
            calls.append(("IBuilderConfig.set_compute_capability", cc.name, index))

    class Builder:
        def __init__(self, logger):
            calls.append(("Builder",))
            self.logger = logger

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
                self.logger.log(ILogger.Severity.ERROR, build_fails_with)
                return None
            if config.progress_monitor is not None:
                mon = config.progress_monitor
                mon.phase_start("Building engine", None, 2)
                mon.step_complete("Building engine", 0)
                mon.phase_finish("Building engine")
            return plan

    class Runtime:
        def __init__(self, logger):
            calls.append(("Runtime",))
            self.logger = logger

        def deserialize_cuda_engine(self, data):
            calls.append(("Runtime.deserialize_cuda_engine", len(data)))
            if engine_io is None:
                self.logger.log(ILogger.Severity.ERROR, "fake: no engine can be deserialized")
                return None
            return Engine()

    class Context:
        def __init__(self, n):
            self.n, self.shapes = n, {}

        def set_input_shape(self, name, shape):
            calls.append(("ctx.set_input_shape", self.n, name, tuple(shape)))
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name):
            batch = next(iter(self.shapes.values()))[0]
            return tuple(batch if d == -1 else d for d in io[name][2])

        def set_tensor_address(self, name, ptr):
            calls.append(("ctx.set_tensor_address", self.n, name, int(ptr)))
            return True

        def execute_async_v3(self, stream_handle):
            calls.append(("ctx.execute_async_v3", self.n, int(stream_handle)))
            return True

    io = {name: (mode, dtype, tuple(shape)) for name, mode, dtype, shape in (engine_io or [])}

    class Engine:
        num_io_tensors = len(io)

        def __init__(self):
            self.contexts = 0

        def get_tensor_name(self, i):
            return list(io)[i]

        def get_tensor_mode(self, name):
            return _IOMode[io[name][0]]

        def get_tensor_dtype(self, name):
            return {"float32": _DType.FLOAT, "float16": _DType.HALF}[io[name][1]]

        def get_tensor_shape(self, name):
            return io[name][2]

        def create_execution_context(self, *config):
            calls.append(("engine.create_execution_context", self.contexts))
            self.contexts += 1
            return Context(self.contexts - 1)

    m.TensorIOMode = _IOMode
    m.Builder, m.OnnxParser, m.Runtime = Builder, OnnxParser, Runtime
    return m


def install(monkeypatch, fake, gpu: dict | None = None):
    """Make ``fake`` importable under both of its names and pretend this machine has ``gpu``."""
    import sys

    names = ("tensorrt_rtx", "tensorrt_rtx_bindings") if fake.__name__ == "tensorrt_rtx" else \
        ("tensorrt", "tensorrt_bindings")
    monkeypatch.setitem(sys.modules, names[0], fake)
    for other in ("tensorrt", "tensorrt_bindings", "tensorrt_rtx", "tensorrt_rtx_bindings"):
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
