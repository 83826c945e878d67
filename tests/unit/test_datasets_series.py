"""One series over time, as the CSV files sktime ships hold it: read as one series, cut into windows, its tail held
out without a frame shared with the training windows, forecast by `up --dataset`; and too short a series refused."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest

from streamtrain.config import StreamtrainConfig
from streamtrain.config.loader import ConfigError, load_config
from streamtrain.datasets import DatasetError, SeriesTooShort, load_dataset, split_series
from streamtrain.datasets.windows import default_window
from streamtrain.objectives import infer_objective
from streamtrain.stack.replay import resolve_replay

SKTIME = Path((importlib.util.find_spec("sktime").submodule_search_locations or [""])[0]) / "datasets" / "data"
AIRLINE = SKTIME / "Airline" / "Airline.csv"


def _config(**sets: object) -> StreamtrainConfig:
    return load_config(env={}, overrides=sets)


@pytest.mark.parametrize(("name", "length", "first", "last"), [
    ("Airline/Airline.csv", 144, 112.0, 432.0),
    ("ShampooSales/ShampooSales.csv", 36, 266.0, 646.9),
    ("Lynx/Lynx.csv", 114, 269.0, 3396.0),
])
def test_a_csv_of_one_series_is_one_unlabelled_sample_to_forecast(name: str, length: int, first: float,
                                                                  last: float) -> None:
    data = load_dataset(SKTIME / name)
    assert len(data) == 1 and data.samples[0].shape == (length, 1)  # the date, time or year is no feature
    assert data.samples[0][0, 0] == pytest.approx(first) and data.samples[0][-1, 0] == pytest.approx(last)
    assert not data.labelled and data.targets is None
    assert infer_objective(data) == ("forecast", "one series over time, no label or target: its own future")


def test_a_time_index_is_left_out_of_a_series_but_a_count_stays_in_a_table(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        lynx = load_dataset(SKTIME / "Lynx" / "Lynx.csv")
        longley = load_dataset(SKTIME / "Longley" / "Longley.csv")
    assert "column '(unnamed)' left out of the features: it counts the frames of the series (1821, 1822, ...)" \
        in caplog.text
    assert "column 'YEAR' left out" in caplog.text and "column 'Obs' left out" in caplog.text
    assert lynx.samples[0][:2, 0].tolist() == [269.0, 321.0]
    assert longley.samples[0].shape == (16, 6)  # TOTEMP .. POP: neither the observation's number nor the year
    # A column rising by 2, or by 1 from a fraction, is measured, not counted.
    (tmp_path / "s.csv").write_text("t,v,w\n1,2,0.5\n2,4,1.5\n3,6,2.5\n")
    assert load_dataset(tmp_path / "s.csv").samples[0][:, 0].tolist() == [2.0, 4.0, 6.0]
    (tmp_path / "count.csv").write_text("Date,n\n2001-01,7\n2001-02,8\n2001-03,9\n")  # nothing else: the series
    assert load_dataset(tmp_path / "count.csv").samples[0][:, 0].tolist() == [7.0, 8.0, 9.0]
    # In a table of rows (a target named) a count is a feature, as before.
    assert load_dataset(tmp_path / "s.csv", target_columns=("w",)).samples[0].shape == (1, 2)


def test_a_csv_without_a_header_loses_no_line_and_names_its_columns_by_position(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # sktime's ElectricDevices.csv: an index and a value per line, no header. Its first line is data.
    (tmp_path / "raw.csv").write_text("1,-0.18\n2,0.09\n3,0.08\n4,0.5\n")
    with caplog.at_level("WARNING"):
        series = load_dataset(tmp_path / "raw.csv")
    assert "its first line holds numbers only, so it is read as data, not as a header: its columns are named by " \
           "position, 0 to 1" in caplog.text and "column '0' left out" in caplog.text
    np.testing.assert_allclose(series.samples[0][:, 0], [-0.18, 0.09, 0.08, 0.5], rtol=1e-6)  # all four lines
    (tmp_path / "rows.csv").write_text("0.5,1,3\n0.7,2,4\nx,3,5\n")
    with pytest.raises(DatasetError, match="line 3: "):  # numbered as the file's lines
        load_dataset(tmp_path / "rows.csv", target_columns=("2",))
    (tmp_path / "rows.csv").write_text("0.5,1,3\n0.7,2,4\n0.1,3,5\n")
    table = load_dataset(tmp_path / "rows.csv", target_columns=("2",))
    assert len(table) == 3 and table.targets is not None and table.targets[:, 0].tolist() == [3.0, 4.0, 5.0]
    # A header of names, or of numbers beside a name (wavelengths and a target), stays a header.
    (tmp_path / "wide.csv").write_text("850,852,fat\n0.1,0.2,9\n0.3,0.4,8\n")
    assert len(load_dataset(tmp_path / "wide.csv", target_columns=("fat",))) == 2


def test_a_repeated_text_column_is_a_class_not_a_time_stamp(tmp_path: Path) -> None:
    (tmp_path / "iris.csv").write_text("length,width,species\n5.1,3.5,setosa\n7.0,3.2,versicolor\n5.0,3.6,setosa\n")
    with pytest.raises(DatasetError, match=r"no 'label' column \(columns: length, width, species\): .*label_column="
                                           r"COLUMN.*; column 'species' repeats its text \('setosa', \.\.\.\)"):
        load_dataset(tmp_path / "iris.csv")
    assert load_dataset(tmp_path / "iris.csv", label_column="species").class_names == ("setosa", "versicolor")


def test_a_missing_value_leaves_the_series_out_as_any_sample_with_one(tmp_path: Path) -> None:
    (tmp_path / "gap.csv").write_text("Date,v\n2001-01,1\n2001-02,\n2001-03,3\n")
    with pytest.raises(DatasetError, match=r"gap.csv sample 0: feature 0 holds NaN"):
        load_dataset(tmp_path / "gap.csv")


def _frames(starts: tuple[int, ...], window: int) -> set[int]:
    return {s + i for s in starts for i in range(window)}


@pytest.mark.parametrize(("length", "horizon", "window", "stride", "share"), [
    (144, 1, None, 1, 0.25), (144, 12, None, 1, 0.25), (36, 1, None, 1, 0.25), (114, 3, 20, 4, 0.3),
    (1000, 5, None, 7, 0.1), (50, 2, 10, 3, 0.5),
])
def test_held_out_windows_share_no_frame_with_training_windows(length: int, horizon: int, window: int | None,
                                                              stride: int, share: float) -> None:
    series = np.arange(length, dtype=np.float32).reshape(-1, 1)  # each frame's value is its index
    cut = split_series(series, horizon, window, stride, share)
    size = window or default_window(length, horizon)
    assert cut.window == size and size > horizon
    for starts, windows in ((cut.train_starts, cut.train), (cut.held_out_starts, cut.held_out)):
        assert [int(w[0, 0]) for w in windows] == list(starts)  # consecutive frames from each start
        assert all(w[:, 0].tolist() == list(range(s, s + size)) for s, w in zip(starts, windows, strict=True))
        assert all(b - a == stride for a, b in itertools.pairwise(starts))
    trained, held = _frames(cut.train_starts, size), _frames(cut.held_out_starts, size)
    assert cut.train and cut.held_out and not trained & held
    assert max(trained) < cut.train_frames <= min(held)  # training before the tail, the tail after it
    assert length - cut.train_frames >= max(size, share * length)  # the tail: its share, at least one window
    assert cut.train_starts[0] == 0 and cut.held_out_starts[0] == cut.train_frames


def test_airlines_default_windows() -> None:
    cut = split_series(load_dataset(AIRLINE).samples[0], horizon=1)
    assert (cut.window, len(cut.train), len(cut.held_out), cut.train_frames) == (25, 84, 12, 108)
    assert cut.held_out[-1][-1, 0] == 432.0  # the series' last month is the last held-out window's future
    assert "12 held out from the last 36 frames (108-143" in cut.describe()


def test_too_short_a_series_names_its_file_its_length_and_the_setting() -> None:
    with pytest.raises(SeriesTooShort, match=r"^short.csv: a series of 10 frames is too short for one window of 7 "
                                             r"frames \(producer.dataset.window\) to train on and a held-out tail of 7 "
                                             r"frames after it: it needs at least 14 frames \(--set producer.dataset."
                                             r"window=N with a smaller N"):
        split_series(np.ones((10, 1)), 1, window=7, where="short.csv")
    with pytest.raises(SeriesTooShort, match=r"producer.dataset.window=3 leaves no frame to forecast "
                                             r"trainer.horizon=3 from"):
        split_series(np.ones((100, 1)), 3, window=3)
    split_series(np.ones((14, 1)), 1, window=7)  # exactly long enough


def test_up_forecasts_a_single_series_from_windows_and_holds_out_its_tail(tmp_path: Path) -> None:
    replay = resolve_replay(str(AIRLINE), _config(), devices=4, workdir=tmp_path)
    assert replay.objective == "forecast" and replay.samples == 84
    train, test = Path(str(replay.settings["producer.dataset.path"])), Path(str(replay.settings["trainer.eval_path"]))
    assert (train, test) == (tmp_path / "Airline_TRAIN.npz", tmp_path / "Airline_TEST.npz")
    assert replay.held_out == str(test) and replay.settings["trainer.model"] == "seqflat"
    assert "84 to train on from frames 0-107, 12 held out from the last 36 frames" in replay.series_note
    series = load_dataset(AIRLINE).samples[0][:, 0]
    trained, held = load_dataset(train), load_dataset(test)
    assert set(trained.sizes.tolist()) == set(held.sizes.tolist()) == {25} and len(held) == 12
    assert not trained.labelled and not held.labelled
    for i, w in enumerate(trained.samples):
        assert w[:, 0].tolist() == series[i:i + 25].tolist()  # frames 0 .. 107 only
    for i, w in enumerate(held.samples):
        assert w[:, 0].tolist() == series[108 + i:133 + i].tolist()  # frames 108 .. 143 only
    assert infer_objective(trained)[0] == "forecast"


def test_produce_publishes_the_windows_up_trains_on_and_not_the_held_out_tail(tmp_path: Path) -> None:
    from streamtrain.producers.sources import build_source

    producer = _config(**{"producer.dataset.path": str(AIRLINE), "producer.devices": 1}).producer
    _source, replayed = build_source(producer)
    up = load_dataset(Path(str(resolve_replay(str(AIRLINE), _config(), devices=4, workdir=tmp_path)
                               .settings["producer.dataset.path"])))
    assert replayed is not None and len(replayed) == len(up) == 84 and not replayed.labelled
    assert all(np.array_equal(a, b) for a, b in zip(replayed.samples, up.samples, strict=True))
    short = tmp_path / "short.csv"
    short.write_text("t,v\n" + "".join(f"{i},{i * i}\n" for i in range(4)))
    with pytest.raises(ValueError, match=r"short.csv: a series of 4 frames is too short"):
        build_source(_config(**{"producer.dataset.path": str(short)}).producer)


def test_up_refuses_too_short_a_series_and_bad_window_settings(tmp_path: Path) -> None:
    (tmp_path / "short.csv").write_text("Date,v\n" + "".join(f"2001-{m:02d},{m * m}\n" for m in range(1, 6)))
    with pytest.raises(ValueError, match=r"short.csv: a series of 5 frames is too short for one window of 3 frames "
                                         r"\(the default, trainer.horizon \+ a sixth of the series; producer.dataset."
                                         r"window\) to train on and a held-out tail of 3 frames"):
        resolve_replay(str(tmp_path / "short.csv"), _config(), workdir=tmp_path)
    for setting, value in (("window", 1), ("stride", 0), ("held_out_share", 1.0), ("window", "many")):
        with pytest.raises(ConfigError, match=rf"producer.dataset.{setting}: "):
            _config(**{f"producer.dataset.{setting}": value})


def test_a_named_held_out_set_keeps_its_place(tmp_path: Path) -> None:
    rows = [f"{1990 + i // 12}-{i % 12 + 1:02d},{np.sin(i / 3):.4f}\n" for i in range(60)]
    (tmp_path / "Sine_TRAIN.csv").write_text("Month,v\n" + "".join(rows))
    (tmp_path / "Sine_TEST.csv").write_text("Month,v\n" + "".join(rows[:30]))
    out = tmp_path / "out"
    replay = resolve_replay(str(tmp_path / "Sine_TRAIN.csv"), _config(**{"producer.dataset.window": 10}),
                            workdir=out)
    assert replay.samples == 51 and replay.held_out == str(out / "Sine_TEST.npz")  # every window of the training file
    assert len(load_dataset(out / "Sine_TEST.npz")) == 21  # the _TEST file, itself one series, cut whole
    mine = resolve_replay(str(tmp_path / "Sine_TRAIN.csv"), _config(**{"trainer.eval_path": str(tmp_path / "x.npz")}),
                          workdir=tmp_path / "mine")
    assert mine.held_out == str(tmp_path / "x.npz") and "trainer.eval_path" not in mine.settings
