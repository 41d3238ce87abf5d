"""Prompt sets shared by the benchmarks, the race and the playground's examples (one home for each text).

PROMPTS: free-form code, prose and chat, where a draft model has to guess. GROUNDED: input-grounded tasks (edit a
given function, summarise or answer from a given text), where much of the answer is copied from the prompt, so the
n-gram drafter (prompt lookup: no draft model, drafting costs ~nothing) keeps long runs of guesses. Each grounded
entry carries the settings it is shown with.
"""

from __future__ import annotations

PROMPTS = {
    "code": [
        "def fibonacci(n):",
        "# Python: read a CSV file and print the sum of the 'amount' column\nimport csv\n",
        "class Stack:\n    \"\"\"A simple LIFO stack.\"\"\"\n\n    def __init__(self):",
    ],
    "prose": [
        "The history of the printing press begins",
        "Once upon a time, in a small village by the sea,",
        "Rain fell on the city all night, and by morning",
    ],
    "chat": [
        "Explain what a hash map is in two sentences.",
        "Give three tips for writing clear commit messages.",
        "What is the difference between a list and a tuple in Python?",
    ],
}
# Copying drafters are deterministic (one-hot q): greedy decoding keeps a copied guess whenever it is the target's
# argmax, and a long draft costs nothing to propose. gamma 32 lets a strong match copy 32 tokens (the ngram drafter
# copies fewer after a short match, drafters.ngram.copy_length): on these prompts runs of 16 are often kept whole.
COPY_SETTINGS = {"drafter": "ngram", "gamma": 32, "temperature": 0.0}

GROUNDED = [
    {"label": "Grounded · rename in a given function", "kind": "grounded", "chat": True, **COPY_SETTINGS, "prompt": (
        "Rename the variable `total` to `running_sum` in this function and return the whole function, nothing else."
        "\n\n```python\ndef average(values):\n    total = 0\n    count = 0\n    for v in values:\n"
        "        if v is None:\n            continue\n        total += v\n        count += 1\n"
        "    if count == 0:\n        return 0.0\n    return total / count\n```")},
    {"label": "Grounded · add type hints to a given function", "kind": "grounded", "chat": True, **COPY_SETTINGS, "prompt": (
        "Add type hints to this function. Reply with the full function only.\n\n```python\n"
        "def merge_counts(a, b):\n    result = dict(a)\n    for key, value in b.items():\n"
        "        result[key] = result.get(key, 0) + value\n    return result\n```")},
    {"label": "Grounded · summarise a given paragraph", "kind": "grounded", "chat": True, **COPY_SETTINGS, "prompt": (
        "Summarise this paragraph in two sentences.\n\n"
        "The lighthouse at Point Arden was built in 1871 to guide ships around a reef that had wrecked eleven "
        "vessels in twenty years. Its first keeper, Thomas Hale, kept the lamp burning for thirty-two years and "
        "recorded every passing ship in a logbook that survives today. In 1936 the light was automated, and the "
        "keeper's house became a small museum that displays the logbook, the original lens and photographs of "
        "the wrecks.")},
    {"label": "Grounded · answer from a given text", "kind": "grounded", "chat": True, **COPY_SETTINGS, "prompt": (
        "Answer using only the text below: when was the light automated, and what happened to the keeper's house?"
        "\n\nThe lighthouse at Point Arden was built in 1871 to guide ships around a reef that had wrecked eleven "
        "vessels in twenty years. Its first keeper, Thomas Hale, kept the lamp burning for thirty-two years. In "
        "1936 the light was automated, and the keeper's house became a small museum that displays the logbook, "
        "the original lens and photographs of the wrecks.")},
]

