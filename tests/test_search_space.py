"""Search-space files: every shipped file validates, each dimension converts to the right Ray Tune object,
and every bad input is one line naming the key and what is allowed."""
from pathlib import Path

import pytest
from ray.tune.search import sample

from pefusion import record as R
from pefusion.errors import ConfigError
from pefusion.fusion.config import RULES as PEFUSION_RULES, check_pe_fusion_pairs
from conftest import pe_fusion_pairs
from pefusion.student.config import RULES as STUDENT_RULES
from pefusion.sweep.space import (Choice, Constant, Grid, LogUniform, RandInt, SearchSpaceError, Uniform, grid_size,
                                  load_search_space, parse_search_space, require_no_grid, to_optuna, to_tune)
from conftest import has_grid

SPACES = Path(__file__).resolve().parents[1] / "search_spaces"
RULES_OF = {"arxiv_grid": PEFUSION_RULES, "lr_batch": PEFUSION_RULES, "lambda_cv": STUDENT_RULES,
            "phase_diagram": STUDENT_RULES}


def test_every_shipped_file_loads_with_its_rules():
    files = sorted(SPACES.glob("*.yaml"))
    assert {f.stem for f in files} >= set(RULES_OF)
    for f in files:
        sweep = next(k for k in RULES_OF if f.stem == k or f.stem.startswith(k + "_"))  # <sweep>_<preset>.yaml
        space = load_search_space(f, RULES_OF[sweep])
        assert len(space) > 0, f
        to_tune(space)  # converts without error


def test_shipped_files_have_the_documented_sizes():
    arxiv = load_search_space(SPACES / "arxiv_grid.yaml", PEFUSION_RULES)
    assert grid_size(arxiv) == 4 * 5 * 5
    assert grid_size(load_search_space(SPACES / "arxiv_grid_demo.yaml", PEFUSION_RULES)) == 4 * 5 * 3
    for table1 in ("arxiv_grid_agnews.yaml", "arxiv_grid_imdb.yaml"):  # the paper's Table 1 cells, seeds 0-4
        space = load_search_space(SPACES / table1, PEFUSION_RULES)
        assert grid_size(space) == 15 and tuple(space[R.SEED].values) == (0, 1, 2, 3, 4)
        assert set(pe_fusion_pairs(space)) == {("sinusoidal", f) for f in ("add", "concat", "gate_vector")}
    assert grid_size(load_search_space(SPACES / "lambda_cv_demo.yaml", STUDENT_RULES)) == 8 * 2
    assert grid_size(load_search_space(SPACES / "phase_diagram_demo.yaml", STUDENT_RULES)) == 6 * 2 * 4
    assert set(pe_fusion_pairs(arxiv)) == {(p, f) for p in ("sinusoidal", "learned", "rope", "relative")
                                          for f in ("add", "concat", "gate_scalar", "gate_cnn", "mlp_gate")}
    lr = load_search_space(SPACES / "lr_batch.yaml", PEFUSION_RULES)
    assert not has_grid(lr) and grid_size(lr) == 1
    require_no_grid(lr, "with Optuna")  # the Optuna sweep's space must pass
    assert lr["lr"] == LogUniform(1e-4, 3e-3)  # "1e-4" (a YAML string) became a float
    assert pe_fusion_pairs(lr) == [("sinusoidal", "gate_scalar")]
    cv = load_search_space(SPACES / "lambda_cv.yaml", STUDENT_RULES)
    assert grid_size(cv) == 10 * 2 * 3
    assert cv["lam_grid_min"] == Constant(1e-4) and cv["folds"] == Constant(5) and cv["omega"] == Constant(0.3)
    phase = load_search_space(SPACES / "phase_diagram.yaml", STUDENT_RULES)
    assert phase["omega"] == Grid((0.0, 0.1, 0.2, 0.3, 0.4)) and phase["lam"] == Constant(0.01)
    assert grid_size(phase) == 20 * 5 * 8  # 8 seeds per point: its call needs them (docs/student.md)


def test_each_dimension_parses_and_converts_to_its_tune_object():
    space = parse_search_space({
        "pe_type": {"grid": ["sinusoidal", "learned"]},
        "batch_size": {"choice": [16, 32, 64]},
        "dropout": {"uniform": [0.0, 0.3]},
        "lr": {"loguniform": ["1e-4", 1e-2]},
        "gate_kernel": {"randint": [3, 8]},
        "max_epochs": 3,
        "norm_first": {"grid": [False, True]},
    }, PEFUSION_RULES)
    assert space["lr"] == LogUniform(1e-4, 1e-2) and space["gate_kernel"] == RandInt(3, 8)
    assert space["max_epochs"] == Constant(3)
    tuned = to_tune(space)
    assert tuned["pe_type"] == {"grid_search": ["sinusoidal", "learned"]}
    assert tuned["norm_first"] == {"grid_search": [False, True]}
    assert isinstance(tuned["batch_size"], sample.Categorical) and tuned["batch_size"].categories == [16, 32, 64]
    d = tuned["dropout"]
    assert isinstance(d.get_sampler(), sample.Float._Uniform) and (d.lower, d.upper) == (0.0, 0.3)
    lr = tuned["lr"]
    assert isinstance(lr.get_sampler(), sample.Float._LogUniform) and (lr.lower, lr.upper) == (1e-4, 1e-2)
    k = tuned["gate_kernel"]
    assert isinstance(k, sample.Integer) and (k.lower, k.upper) == (3, 8)  # upper exclusive on both sides
    assert tuned["max_epochs"] == 3
    assert list(tuned) == list(space)  # file order kept
    assert grid_size(space) == 4 and has_grid(space)


def test_optuna_distributions_are_those_ray_samples_optuna_from():
    from optuna.distributions import CategoricalDistribution
    from ray.tune.search.optuna import OptunaSearch

    space = parse_search_space({"batch_size": {"choice": [16, 32, 64]}, "dropout": {"uniform": [0.0, 0.3]},
                                "lr": {"loguniform": [1e-4, 1e-2]}, "gate_kernel": {"randint": [3, 8]},
                                "max_epochs": 3}, PEFUSION_RULES)
    assert to_optuna(space) == OptunaSearch.convert_search_space(to_tune(space))  # constants left out by both
    grid = parse_search_space({"pe_type": {"grid": ["sinusoidal", "learned"]}}, PEFUSION_RULES)
    assert to_optuna(grid) == {"pe_type": CategoricalDistribution(("sinusoidal", "learned"))}


def test_numbers_are_typed_by_the_rule():
    space = parse_search_space({"lr": {"choice": [1, "3e-4"]}, "seed": {"grid": [0, 1.0]}, "alpha": 1},
                               {**PEFUSION_RULES, "alpha": STUDENT_RULES["alpha"]})
    assert space["lr"] == Choice((1.0, 3e-4)) and all(type(v) is float for v in space["lr"].values)
    assert space["seed"] == Grid((0, 1)) and all(type(v) is int for v in space["seed"].values)
    assert space["alpha"] == Constant(1.0)


def _error(mapping, rules=PEFUSION_RULES, source="search_spaces/x.yaml") -> str:
    with pytest.raises(SearchSpaceError) as info:
        parse_search_space(mapping, rules, source)
    message = str(info.value)
    assert "\n" not in message and message.startswith(source + ": "), message
    return message


@pytest.mark.parametrize("mapping, rules, needles", [
    ({"learning_rate": 1e-3}, PEFUSION_RULES, ["unknown key 'learning_rate'", "allowed: d_model", "lr"]),
    ({"pe_type": {"grid": ["sinusoidal", "rotery"]}}, PEFUSION_RULES,
     ["pe_type", "'rotery' is not allowed", "did you mean 'rotary'", "sinusoidal, learned, rope, relative"]),
    ({"fusion": {"choice": ["add", "gated"]}}, PEFUSION_RULES,
     ["fusion", "'gated' is not allowed", "add, mul, concat, gate_scalar, gate_vector, gate_cnn, mlp, mlp_gate"]),
    ({"lr": {"uniform": [0.01, 0.001]}}, PEFUSION_RULES, ["lr", "needs low < high", "[0.01, 0.001]"]),
    ({"gate_kernel": {"randint": [5, 5]}}, PEFUSION_RULES, ["gate_kernel", "high is exclusive"]),
    ({"lr": {"loguniform": [0, 1e-2]}}, PEFUSION_RULES, ["lr", "loguniform needs 0 < low < high", "[0.0, 0.01]"]),
    ({"lr": {"loguniform": [1e-2, 1e-3]}}, PEFUSION_RULES, ["lr: loguniform needs 0 < low < high"]),
    ({"batch_size": {"choice": [16, "big"]}}, PEFUSION_RULES, ["batch_size", "'big' is not an integer", "> 0"]),
    ({"seed": {"grid": [0, 1.5]}}, PEFUSION_RULES, ["seed", "1.5 is not an integer", ">= 0"]),
    ({"norm_first": "yes"}, PEFUSION_RULES, ["norm_first", "'yes' is not true or false"]),
    ({"lr": True}, PEFUSION_RULES, ["lr", "True is not a number"]),
    ({"seed": {"grid": []}}, PEFUSION_RULES, ["seed", "grid is empty"]),
    ({"seed": [0, 1]}, PEFUSION_RULES, ["seed", "{grid: [...]} or {choice: [...]}"]),
    ({"seed": {"gird": [0, 1]}}, PEFUSION_RULES, ["seed", "unknown dimension ['gird']", "grid, choice, uniform"]),
    ({"seed": {"grid": [1, 1]}}, PEFUSION_RULES, ["seed", "repeats a value"]),
    ({"lr": -1e-3}, PEFUSION_RULES, ["lr", "out of range", "allowed: > 0"]),
    ({"dropout": {"uniform": [0.0, 1.0]}}, PEFUSION_RULES, ["dropout", "out of range", "allowed: [0, 1)"]),
    ({"batch_size": {"uniform": [8, 64]}}, PEFUSION_RULES,
     ["batch_size: uniform samples real numbers but batch_size takes an integer; use randint"]),
    ({"pe_type": {"randint": [0, 3]}}, PEFUSION_RULES, ["pe_type", "use grid or choice"]),
    ({"lr": {"loguniform": [1e-4]}}, PEFUSION_RULES, ["lr", "loguniform needs [low, high]"]),
    ({"pe_type": {"grid": ["sinusoidal", "rotary"]}, "fusion": {"grid": ["add", "concat"]}}, PEFUSION_RULES,
     ["pe_type x fusion", "(rotary, add)", "use fusion='none'", "separate search spaces"]),
    ({"pe_type": "rotary"}, PEFUSION_RULES, ["(rotary, add)", "use fusion='none'"]),  # fusion from the defaults
    ({"omega": 1.5}, STUDENT_RULES, ["omega", "out of range", "allowed: [0, 1]"]),
    ({"init": "semantc"}, STUDENT_RULES, ["init", "did you mean 'semantic'", "semantic, positional, random"]),
    ({"L": 3}, STUDENT_RULES, ["L", "3 is not allowed", "choose from 2", "two tokens"]),
    ({"folds": 1}, STUDENT_RULES, ["folds", "allowed: >= 2"]),
    ({"teacher_A": "other"}, STUDENT_RULES, ["teacher_A", "choose from default, alt"]),
    ({"alpha": {"grid": [0.0, 0.5]}}, STUDENT_RULES, ["alpha", "0.0 is out of range", "> 0"]),
    ({"pe_type": "rope"}, STUDENT_RULES, ["unknown key 'pe_type'", "alpha, omega, sigma"]),
])
def test_bad_inputs_are_one_line_naming_the_key_and_the_allowed_values(mapping, rules, needles):
    message = _error(mapping, rules)
    for needle in needles:
        assert needle in message, (needle, message)


def test_errors_are_config_errors_and_value_errors():
    assert issubclass(SearchSpaceError, ConfigError) and issubclass(SearchSpaceError, ValueError)


def test_file_problems_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pe_type: {grid: [sinusoidal, learned\nfusion: add\n")
    with pytest.raises(SearchSpaceError, match=r"bad\.yaml: malformed YAML at line \d+, column \d+: ") as info:
        load_search_space(bad, PEFUSION_RULES)
    assert "\n" not in str(info.value)
    listing = tmp_path / "list.yaml"
    listing.write_text("- sinusoidal\n- learned\n")
    with pytest.raises(SearchSpaceError, match=r"list\.yaml: a search space is a mapping"):
        load_search_space(listing, PEFUSION_RULES)
    with pytest.raises(SearchSpaceError, match=r"missing\.yaml: cannot read"):
        load_search_space(tmp_path / "missing.yaml", PEFUSION_RULES)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("lr: {loguniform: [1e-4, 1e-2]}\nlearning_rate: 0.1\n")
    with pytest.raises(SearchSpaceError, match=r"unknown\.yaml: unknown key 'learning_rate'"):
        load_search_space(unknown, PEFUSION_RULES)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing: the preset decides\n")
    nothing = load_search_space(empty, PEFUSION_RULES)
    assert len(nothing) == 0 and grid_size(nothing) == 1 and to_tune(nothing) == {}


def test_optuna_spaces_reject_grids():
    space = load_search_space(SPACES / "arxiv_grid.yaml", PEFUSION_RULES)
    with pytest.raises(SearchSpaceError) as info:
        require_no_grid(space, "with Optuna (it samples every key)")
    message = str(info.value)
    assert "\n" not in message and "arxiv_grid.yaml: pe_type: grid cannot be used with Optuna" in message
    assert "pe_type: {choice: ['sinusoidal', 'learned', 'rope', 'relative']}" in message


def test_override_replaces_and_validates():
    space = load_search_space(SPACES / "arxiv_grid.yaml", PEFUSION_RULES)
    narrowed = space.override_values("pe_type", "sinusoidal, rope")
    assert narrowed["pe_type"] == Grid(("sinusoidal", "rope")) and grid_size(narrowed) == 2 * 5 * 5
    assert space["pe_type"] == Grid(("sinusoidal", "learned", "rope", "relative"))  # the original is untouched
    assert list(narrowed) == list(space)
    seeds = space.override_values("seed", "0,1")  # command-line strings become ints
    assert seeds["seed"] == Grid((0, 1))
    lr = load_search_space(SPACES / "lr_batch.yaml", PEFUSION_RULES)
    assert lr.override_values("batch_size", [8, 16])["batch_size"] == Choice((8, 16))  # a choice stays a choice
    assert lr.override("lr", Uniform(1e-4, 1e-3))["lr"] == Uniform(1e-4, 1e-3)
    assert lr.override("dropout", Constant(0.2))["dropout"] == Constant(0.2)  # new keys are appended
    with pytest.raises(SearchSpaceError, match=r"arxiv_grid\.yaml: pe_type: 'rotery' is not allowed"):
        space.override_values("pe_type", "sinusoidal,rotery")
    with pytest.raises(SearchSpaceError, match=r"\(rotary, add\)"):
        space.override_values("pe_type", "rotary")
    attention = parse_search_space({"pe_type": {"grid": ["rotary", "alibi"]}, "fusion": "none"}, PEFUSION_RULES)
    assert pe_fusion_pairs(attention) == [("rotary", "none"), ("alibi", "none")]
    with pytest.raises(SearchSpaceError, match="unknown key 'learning_rate'"):
        space.override("learning_rate", Constant(0.1))


def test_pe_fusion_pairs_fill_missing_keys_from_the_base_model():
    from pefusion.fusion.config import ModelConfig
    space = parse_search_space({"fusion": {"grid": ["add", "concat"]}}, PEFUSION_RULES)
    assert pe_fusion_pairs(space) == [("sinusoidal", "add"), ("sinusoidal", "concat")]
    base = ModelConfig(pe_type="rotary", fusion="none")
    assert pe_fusion_pairs(space, base) == [("rotary", "add"), ("rotary", "concat")]
    with pytest.raises(SearchSpaceError, match=r"\(rotary, add\)"):
        check_pe_fusion_pairs(space, base)
