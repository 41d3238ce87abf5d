"""Input-grounded prompts, and the drafter benchmark: `python -m specdec bench --drafter model|ngram|early-exit|cross`.

Grounded prompts give the model a text to work on (a function to edit, a paragraph to summarise, a passage to
answer from): the answer copies much of its input, which is where prompt lookup shines.
"""

from __future__ import annotations

GROUNDED = [
    {"label": "Grounded · rename in a given function", "kind": "grounded", "chat": True, "prompt": (
        "Rename the variable `total` to `running_sum` in this function and return the whole function, nothing else."
        "\n\n```python\ndef average(values):\n    total = 0\n    count = 0\n    for v in values:\n"
        "        if v is None:\n            continue\n        total += v\n        count += 1\n"
        "    if count == 0:\n        return 0.0\n    return total / count\n```")},
    {"label": "Grounded · add type hints to a given function", "kind": "grounded", "chat": True, "prompt": (
        "Add type hints to this function. Reply with the full function only.\n\n```python\n"
        "def merge_counts(a, b):\n    result = dict(a)\n    for key, value in b.items():\n"
        "        result[key] = result.get(key, 0) + value\n    return result\n```")},
    {"label": "Grounded · summarise a given paragraph", "kind": "grounded", "chat": True, "prompt": (
        "Summarise this paragraph in two sentences.\n\n"
        "The lighthouse at Point Arden was built in 1871 to guide ships around a reef that had wrecked eleven "
        "vessels in twenty years. Its first keeper, Thomas Hale, kept the lamp burning for thirty-two years and "
        "recorded every passing ship in a logbook that survives today. In 1936 the light was automated, and the "
        "keeper's house became a small museum that displays the logbook, the original lens and photographs of "
        "the wrecks.")},
    {"label": "Grounded · answer from a given text", "kind": "grounded", "chat": True, "prompt": (
        "Answer using only the text below: when was the light automated, and what happened to the keeper's house?"
        "\n\nThe lighthouse at Point Arden was built in 1871 to guide ships around a reef that had wrecked eleven "
        "vessels in twenty years. Its first keeper, Thomas Hale, kept the lamp burning for thirty-two years. In "
        "1936 the light was automated, and the keeper's house became a small museum that displays the logbook, "
        "the original lens and photographs of the wrecks.")},
]
