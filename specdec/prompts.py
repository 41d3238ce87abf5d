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
# The examples that answer from a given text copy with the suffix index instead: on the suite's tuning half it was
# the fastest copy drafter on summarization and within noise of the best on RAG (docs/benchmarks.md, "Which copy
# drafter the examples use"); the code edits keep prompt lookup, which no suite kind measures against it.
TEXT_COPY_SETTINGS = {**COPY_SETTINGS, "drafter": "suffix"}

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
    {"label": "Grounded · summarise a given paragraph", "kind": "grounded", "chat": True, **TEXT_COPY_SETTINGS, "prompt": (
        "Summarise this paragraph in two sentences.\n\n"
        "The lighthouse at Point Arden was built in 1871 to guide ships around a reef that had wrecked eleven "
        "vessels in twenty years. Its first keeper, Thomas Hale, kept the lamp burning for thirty-two years and "
        "recorded every passing ship in a logbook that survives today. In 1936 the light was automated, and the "
        "keeper's house became a small museum that displays the logbook, the original lens and photographs of "
        "the wrecks.")},
    {"label": "Grounded · answer from a given text", "kind": "grounded", "chat": True, **TEXT_COPY_SETTINGS, "prompt": (
        "Answer using only the text below: when was the light automated, and what happened to the keeper's house?"
        "\n\nThe lighthouse at Point Arden was built in 1871 to guide ships around a reef that had wrecked eleven "
        "vessels in twenty years. Its first keeper, Thomas Hale, kept the lamp burning for thirty-two years. In "
        "1936 the light was automated, and the keeper's house became a small museum that displays the logbook, "
        "the original lens and photographs of the wrecks.")},
]


# A Spec-Bench-shaped suite (`python -m specdec bench --suite`): the six task kinds of Spec-Bench (multi-turn
# conversation, translation, summarization, question answering, math reasoning, retrieval-augmented answers),
# with prompts written for this project. Every entry is a chat (a list of messages); summarization and RAG carry
# long inputs, as they do there.
_HARBOR = (
    "The harbor town of Velmar grew up around a natural inlet on the northern coast. For most of the eighteenth "
    "century its economy rested on herring: every autumn the shoals came close to shore, and nearly every family "
    "owned a share in a boat or worked in the salting sheds. In 1794 a storm destroyed the old wooden pier, and the "
    "town council borrowed money from merchants in the capital to build a stone breakwater. The breakwater took "
    "eleven years to finish and changed the town in ways nobody had planned. Larger ships could now shelter in the "
    "inlet, and Velmar began to trade timber and iron ore from the inland valleys. By 1830 the herring fleet had "
    "shrunk to a third of its old size, while the port handled four times as much cargo as before. The new trade "
    "brought new people: dock workers from the south, clerks, and a small community of ship's carpenters who "
    "built a yard at the eastern end of the harbor. The yard launched its first steamship in 1861. When the "
    "railway reached Velmar in 1872, much of the ore traffic moved to the trains, and the port declined again. "
    "The shipyard survived by repairing fishing boats, and the town slowly turned back toward the sea it had "
    "started with. Today Velmar is known for its museum of maritime history, which occupies the old customs "
    "house, and for a festival each September that celebrates the return of the herring."
)
_TRIAL = (
    "A clinical trial tested whether a daily fifteen-minute walk after dinner lowers blood sugar in adults with "
    "prediabetes. Two hundred and forty volunteers aged 40 to 70 were split at random into two groups. The walking "
    "group was asked to walk at a comfortable pace within thirty minutes of finishing dinner; the control group "
    "kept their usual habits. Both groups wore activity trackers, and their fasting glucose and HbA1c were "
    "measured at the start, after three months and after six months. After six months the walking group's "
    "average HbA1c had fallen from 6.1 to 5.8 percent, while the control group's had stayed at 6.1 percent. "
    "Fasting glucose showed a smaller difference that was not statistically significant. About one in five "
    "walkers stopped walking regularly after the second month, mostly citing bad weather or evening work; when "
    "the researchers analysed only the people who kept walking, the fall in HbA1c was larger, 0.4 points. The "
    "authors caution that the trial was not blinded, that participants knew their group, and that six months is "
    "too short to say whether the walks prevent diabetes. They call for a longer trial with more varied "
    "participants, since most volunteers were recruited from one city."
)
_DOCS = (
    "[Document 1] The Orlen Library opens at 9:00 on weekdays and at 10:00 on Saturdays. It is closed on Sundays "
    "and public holidays. Members may borrow up to twelve items at a time; the loan period is three weeks for "
    "books and one week for films.\n"
    "[Document 2] Late returns are charged 20 cents per item per day, up to a maximum of 6 dollars per item. "
    "Members under 18 pay no late fees. Fees can be paid at the front desk or online through the member portal.\n"
    "[Document 3] The library's reading room on the second floor is reserved for quiet study. Group study rooms on "
    "the third floor can be booked for up to two hours per day through the member portal; bookings open seven "
    "days in advance.\n"
    "[Document 4] From March, the library will lend laptops for use inside the building. A laptop may be borrowed "
    "for four hours with a valid membership card and must be returned to the front desk before closing.\n"
    "[Document 5] The library's annual book sale takes place in the first week of June. Donations of books in good "
    "condition are accepted at the front desk from January to April."
)
SUITE = {
    "multi-turn": [
        [{"role": "user", "content": "I'm planning a three-day trip to a city I've never visited. What should I "
                                     "sort out before I go?"},
         {"role": "assistant", "content": "Book where you will stay, check how you get from the station or "
                                          "airport to it, look up the opening days of the places you most want "
                                          "to see, and keep copies of your tickets and ID on your phone."},
         {"role": "user", "content": "Good. Now make that into a short checklist I can print, with one line "
                                     "per item."}],
        [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."},
         {"role": "assistant", "content": "def is_palindrome(s):\n    cleaned = ''.join(c.lower() for c in s "
                                          "if c.isalnum())\n    return cleaned == cleaned[::-1]"},
         {"role": "user", "content": "Now add a docstring and two doctest examples to that function, and show "
                                     "the whole function again."}],
        [{"role": "user", "content": "What is the difference between weather and climate?"},
         {"role": "assistant", "content": "Weather is what the atmosphere does over hours or days; climate is "
                                          "the pattern of weather in a place over decades."},
         {"role": "user", "content": "Explain it again for a ten-year-old, in three sentences."}],
    ],
    "translation": [
        [{"role": "user", "content": "Translate into English: « Le train pour Lyon partira avec vingt minutes de "
                                     "retard à cause d'un problème technique. Nous vous prions de nous excuser "
                                     "pour la gêne occasionnée. »"}],
        [{"role": "user", "content": "Translate into English: „Bitte schließen Sie die Fenster, bevor Sie das "
                                     "Büro verlassen, und schalten Sie alle Geräte aus, die Sie nicht mehr "
                                     "brauchen.“"}],
        [{"role": "user", "content": "Translate into German: The museum is open every day except Monday, and "
                                     "entry is free for children under twelve."}],
    ],
    "summarization": [
        [{"role": "user", "content": f"Summarize this text in three sentences.\n\n{_HARBOR}"}],
        [{"role": "user", "content": f"Summarize the findings of this study for a general reader, in four "
                                     f"sentences.\n\n{_TRIAL}"}],
    ],
    "qa": [
        [{"role": "user", "content": "Why does ice float on water?"}],
        [{"role": "user", "content": "What does a compiler do, and how is it different from an interpreter?"}],
        [{"role": "user", "content": "Name three causes of the fall of the Western Roman Empire."}],
    ],
    "math": [
        [{"role": "user", "content": "A shop sells pencils at 3 for 75 cents. How much do 14 pencils cost? Reason "
                                     "step by step."}],
        [{"role": "user", "content": "A train leaves at 09:40 and arrives at 13:15. It stopped for 25 minutes on "
                                     "the way. How long was it moving? Show your working."}],
        [{"role": "user", "content": "Solve for x: 3(x - 4) + 7 = 2x + 5. Explain each step."}],
    ],
    "rag": [
        [{"role": "user", "content": f"Answer using only the documents below. How long can I keep a film, and "
                                     f"what happens if I return it four days late?\n\n{_DOCS}"}],
        [{"role": "user", "content": f"Answer using only the documents below. Can I book a group study room for "
                                     f"next Saturday afternoon, and for how long?\n\n{_DOCS}"}],
        [{"role": "user", "content": f"Answer using only the text below: when did the railway reach Velmar and "
                                     f"what did it change?\n\n{_HARBOR}"}],
    ],
}


# The suite's test half: prompts no default was tuned on (bench --suite --split test, the default split), written
# from public task descriptions of the same six kinds: long articles to summarize, several passages to answer from,
# multi-turn chats whose last turn quotes or reworks an earlier one.
_GLACIER = (
    "Mountain glaciers store water as ice in winter and release it as meltwater in summer, which is why the rivers "
    "that drain them often run highest in July and August, when rain is scarce. Measurements on more than two "
    "hundred reference glaciers show that most of them have been losing mass every year since the 1980s. The loss "
    "is not uniform. Glaciers in the Alps and in western North America have thinned fastest, in some years by more "
    "than a metre of water equivalent across their whole surface, while a few glaciers in the Karakoram held steady "
    "or even grew for two decades, an exception researchers link to heavier winter snowfall and thick layers of "
    "rock debris that insulate the ice. As a glacier shrinks, its summer meltwater first increases, because more "
    "ice is exposed and the melt season is longer. This phase can last decades and gives a misleading impression of "
    "abundance. Once the glacier has lost enough area, summer flow begins to fall, a turning point hydrologists call "
    "peak water. Several Andean catchments appear to have passed it already. For towns that rely on glacier-fed "
    "rivers for drinking water, irrigation or hydropower, the practical question is when the turning point will "
    "come, and studies now combine satellite surveys of ice volume with river gauges to estimate it for each basin."
)
_COOP = (
    "Minutes of the annual meeting of the Brookside Housing Cooperative. Forty-two of the sixty member households "
    "attended, which meets the quorum. The treasurer reported that the cooperative ended the year with a surplus of "
    "18,400 dollars, mainly because the heating bills were lower than budgeted after the boiler was replaced in "
    "spring. She proposed putting 12,000 dollars into the repair reserve and using the rest to repaint the "
    "stairwells. Several members asked whether the reserve was large enough for the roof, which the building survey "
    "says will need replacing within eight years at an estimated cost of 210,000 dollars. The treasurer answered "
    "that at the current rate the reserve would reach about 150,000 dollars by then, so either the monthly "
    "contribution must rise or a loan will be needed. After discussion the meeting voted 31 to 9, with two "
    "abstentions, to raise contributions by 15 dollars a month from January. The meeting also approved the "
    "proposal for a shared bicycle room in the basement, on condition that the fire inspector agrees, and elected "
    "two new members to the board. The next general meeting will be held in June."
)
_CLINIC = (
    "[Passage 1] The Harlow Street clinic offers walk-in appointments from 8:00 to 11:00 on weekdays. After 11:00 "
    "patients are seen by appointment only; appointments can be made by phone or through the clinic's website up to "
    "four weeks ahead.\n"
    "[Passage 2] Flu vaccinations are given from October to December. Adults over 65, pregnant patients and people "
    "with chronic lung or heart conditions are vaccinated free of charge; other adults pay 18 dollars.\n"
    "[Passage 3] Repeat prescriptions must be requested at least three working days before the medicine runs out. "
    "Requests can be left in the box at reception or sent through the website; they are not taken by phone.\n"
    "[Passage 4] The clinic's pharmacy is open until 18:00 on weekdays and until 13:00 on Saturdays. It is closed "
    "on Sundays.\n"
    "[Passage 5] Blood tests are taken on Tuesday and Thursday mornings between 8:00 and 10:30. Patients who must "
    "fast before the test should not eat for ten hours beforehand but may drink water.\n"
    "[Passage 6] From next month, the clinic will send appointment reminders by text message. Patients who do not "
    "want them can opt out at reception."
)
SUITE_TEST = {
    "multi-turn": [
        [{"role": "user", "content": "Write a short email to my landlord saying the kitchen tap has been dripping "
                                     "for a week and asking when someone can fix it."},
         {"role": "assistant", "content": "Subject: Dripping kitchen tap\n\nDear Mr. Ortiz,\n\nThe kitchen tap in "
                                          "flat 4 has been dripping constantly for about a week, and tightening it "
                                          "has not helped. Could you let me know when someone could come to fix "
                                          "it? I am at home most evenings after six.\n\nKind regards,\nDana"},
         {"role": "user", "content": "Good. Rewrite the same email in a firmer tone, because this is the second "
                                     "time I have asked. Keep the subject line and the details."}],
        [{"role": "user", "content": "Give me a simple recipe for lentil soup."},
         {"role": "assistant", "content": "Ingredients: 1 cup red lentils, 1 onion, 2 carrots, 2 cloves garlic, 1 "
                                          "teaspoon cumin, 5 cups vegetable stock, salt, lemon juice.\nSteps: 1. "
                                          "Chop the onion, carrots and garlic and soften them in oil for 5 "
                                          "minutes. 2. Stir in the cumin. 3. Add the rinsed lentils and the stock "
                                          "and simmer for 25 minutes. 4. Blend half of the soup, season with salt "
                                          "and a squeeze of lemon."},
         {"role": "user", "content": "Now write that recipe again for four times as many people, with every "
                                     "quantity multiplied."}],
    ],
    "translation": [
        [{"role": "user", "content": "Translate into English: «El ayuntamiento ha decidido cerrar el puente viejo "
                                     "al tráfico durante dos meses para repararlo. Los peatones podrán seguir "
                                     "cruzándolo por la acera norte.»"}],
        [{"role": "user", "content": "Translate into French: Please keep your ticket until the end of the "
                                     "journey, as inspectors may ask to see it at any time."}],
    ],
    "summarization": [
        [{"role": "user", "content": f"Summarize this article in four sentences.\n\n{_GLACIER}"}],
        [{"role": "user", "content": f"Summarize these meeting minutes as a short list of decisions.\n\n{_COOP}"}],
    ],
    "qa": [
        [{"role": "user", "content": "Why do we see lightning before we hear thunder?"}],
        [{"role": "user", "content": "What is the difference between a virus and a bacterium?"}],
    ],
    "math": [
        [{"role": "user", "content": "A rectangle is 3 cm longer than it is wide and its perimeter is 34 cm. What "
                                     "are its sides? Reason step by step."}],
        [{"role": "user", "content": "A jacket costs 80 dollars. It is reduced by 25 percent, and then the reduced "
                                     "price is cut by another 10 percent. What is the final price? Show your "
                                     "working."}],
    ],
    "rag": [
        [{"role": "user", "content": f"Answer using only the passages below. I need a blood test that requires "
                                     f"fasting: which days can I go, and when should I stop eating?\n\n{_CLINIC}"}],
        [{"role": "user", "content": f"Answer using only the passages below. I am 70: do I pay for a flu "
                                     f"vaccination, and can I order my repeat prescription by phone?\n\n{_CLINIC}"}],
    ],
}
SUITE_SPLITS = {"tune": SUITE, "test": SUITE_TEST}  # bench --suite --split: defaults tuned on one, reported on the other
