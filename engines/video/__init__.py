"""Video in, top-k out: ``for pred in engines.video.classify(["cam1.mp4", "rtsp://..."], engine): ...``

See :mod:`engines.video.pipeline` for how frames flow (NVDEC -> CuPy kernel -> engine on the GPU, zero-copy;
PyAV -> numpy -> ONNX Runtime on the CPU) and :mod:`engines.video.sources` for the decoders.
"""

from .pipeline import Prediction, RunStats, SourceProblem, VideoRun, classify, default_device
from .decoders import release_decoders
from .live import LiveOptions, SourceEvent
from .push import FramePusher, PushHandle
from .sources import NvdecSource, PyAVSource, SourceError, SourceInfo
from .ray_cluster import RayPool
from .workers import WorkerPool

__all__ = ["classify", "default_device", "Prediction", "VideoRun", "RunStats", "SourceProblem", "SourceError",
           "SourceInfo", "NvdecSource", "PyAVSource", "WorkerPool", "release_decoders", "RayPool", "LiveOptions",
           "SourceEvent", "FramePusher", "PushHandle"]
