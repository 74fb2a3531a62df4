"""notebooks/tour.ipynb runs top to bottom without an error, executed by nbclient as notebooks/run.py executes it,
in its fast mode (JREG_NOTEBOOK_FAST=1: a slice of the KJV and two 4-step runs in a temporary folder, the committed
notebook untouched); and the committed notebook holds the outputs of a full run, in order, without an error."""
import importlib.util
import os

import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "tour.ipynb")


def test_the_tour_runs_without_an_error(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("notebook_run", os.path.join(ROOT, "notebooks", "run.py"))
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    monkeypatch.setenv("JREG_NOTEBOOK_FAST", "1")
    before = os.path.getmtime(NOTEBOOK)
    nb = run.execute(out=str(tmp_path / "tour.ipynb"))               # a cell that raises: CellExecutionError here
    assert os.path.getmtime(NOTEBOOK) == before
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs for cell in code)
    images = [o for cell in code for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3                                            # Ψ and ζ, the weights, the layer analysis


def test_the_committed_tour_holds_the_outputs_of_a_full_run():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    outputs = [o for cell in code for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "jreg_tour_" not in text and "at step 300" in text            # the quick start's runs, not the fast mode's
