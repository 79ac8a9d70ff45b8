"""Issue 28 units: class folders to class indices, outputs that are probabilities already, label metadata."""

from __future__ import annotations

import numpy as np
import pytest

from engines.errors import UsageProblem
from toolchain.export import parse_label_metadata
from toolchain.parity import compare
from toolchain.validate import _chance_problem, class_folder_indices


def test_folders_named_as_labels_map_by_label():
    idx, note = class_folder_indices(["0", "180", "270", "90"], ["0", "90", "180", "270"], 4)
    assert idx == [0, 2, 3, 1] and note is None


def test_numbers_never_sort_as_text():
    # no labels, one folder per class: numeric order (text order put 90 last)
    assert class_folder_indices(["0", "180", "270", "90"], None, 4)[0] == [0, 2, 3, 1]
    # whole numbers within the class count are the class index, a subset included (MNIST's 3 and 7)
    assert class_folder_indices(["3", "7"], None, 10) == ([3, 7], None)


def test_folders_and_labels_that_cannot_be_matched_are_refused():
    with pytest.raises(UsageProblem) as e:
        class_folder_indices(["cat", "dgo"], ["cat", "dog", "bird"], 3, "val")
    assert "dgo is not among the model's labels" in e.value.reason and "cat, dog, bird" in e.value.fix
    with pytest.raises(UsageProblem) as e:
        class_folder_indices(["a", "b"], None, 5, "val")
    assert "2 folders for 5 classes" in e.value.reason and "--labels" in e.value.fix


def test_unknown_names_one_per_class_keep_sorted_order_with_a_note():
    idx, note = class_folder_indices(["n01", "n02", "n03"], ["tench", "goldfish", "shark"], 3, "val")
    assert idx == [0, 1, 2] and "sorted order" in note


def test_a_reference_at_chance_fails():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 10)
    wrong = np.eye(4)[(labels + 1) % 4]  # every prediction is the next class
    warnings: list = []
    fail = _chance_problem(wrong, labels, warnings)
    assert fail["metric"] == "reference_accuracy" and fail["value"] == 0.0 and "at chance level" in warnings[0]
    right = np.eye(4)[labels] + rng.normal(0, 0.01, (40, 4))
    assert _chance_problem(right, labels, []) is None
    assert _chance_problem(np.eye(2)[[0, 1]], np.array([0, 1]), []) is None  # two samples, both right


def test_probabilities_get_no_second_softmax():
    p = np.array([[0.925, 0.025, 0.025, 0.025], [0.1, 0.7, 0.1, 0.1]])
    q = np.array([[0.9, 0.05, 0.025, 0.025], [0.1, 0.6, 0.2, 0.1]])
    kl = float(np.mean(np.sum(p * np.log(p / q), axis=1)))
    assert compare(p, q).kl == pytest.approx(kl)  # detected: the rows are distributions
    assert compare(p, q, probabilities=False).kl < kl / 5  # a second softmax flattens them


def test_label_metadata_forms():
    assert parse_label_metadata("0\n90\n180\n270") == ["0", "90", "180", "270"]
    assert parse_label_metadata('["cat", "dog"]') == ["cat", "dog"]
    assert parse_label_metadata("{0: 'person', 1: 'bicycle'}") == ["person", "bicycle"]
    assert parse_label_metadata("cat, dog") == ["cat", "dog"]
    assert parse_label_metadata("resnet") is None
