"""Write the project's own sample drops under data/ (deterministic; rerun gives the same bytes).

    python scripts/make_sample_data.py [DATA_DIR]

sample_text:     short pretraining notes (JSONL drop + TXT drop)
sample_instruct: prompt/completion pairs with computed answers, some multi-turn dialogues,
                 one malformed line and one exact duplicate (to show rejects and dedup)
sample_chat:     ShareGPT and OpenAI-style conversations: system prompts, multi-turn chats, tool use
                 (function_call/observation turns with a `tools` list), a user message holding the
                 template's own special-token strings, an unmapped role (bronze reject) and a chat
                 with no assistant turn (gold reject: no_trained_tokens)
sample_pref:     preference pairs (correct vs wrong worked answer), as messages and as HH transcripts
sample_sensors:  a tabular time series (CSV): hourly readings of 10 sensors, written out of time order, with
                 missing cells, quoted newlines and a carriage return inside values, and one ragged row
corpus/:         the text the sample tokenizers (byte-level BPE) are trained on
"""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

STATIONS = ["Alder Ridge", "Birch Hollow", "Cedar Point", "Dune Flats", "Elm Crossing", "Fjord Bay", "Granite Pass"]
SKIES = ["clear", "overcast", "hazy", "broken cloud", "light drizzle", "steady rain", "fog until mid-morning"]
WINDS = ["calm", "a light breeze from the west", "gusts from the north", "a steady easterly", "variable winds"]
TOPICS = {
    "deduplication": "Exact deduplication hashes the full normalized record, so two chats that share a long "
    "system prompt but differ in their turns are both kept.",
    "packing": "Best-fit decreasing packing places the longest examples first and fills each row as tightly as "
    "it can, which keeps padding low without splitting any example.",
    "loss masks": "A loss mask marks which tokens the model is trained to predict; prompt tokens are masked so "
    "the model learns to answer rather than to repeat the question.",
    "lineage": "Lineage lets an engineer follow a packed row back through the tokenized example and the clean "
    "record to the exact file, line and byte offset it came from.",
    "quality gates": "A quality gate between layers stops bad data early: if the masks do not line up with the "
    "tokens, the shards are never written.",
    "tokenizers": "A byte-level BPE tokenizer never meets an unknown character, because every byte has a token "
    "of its own before any merge is learned.",
    "partitions": "Each file dropped into the raw folder becomes a partition, so a new drop is processed on its "
    "own and a backfill can rebuild any subset of drops.",
    "determinism": "Seeded shuffles and fixed row groups make reruns byte-identical, which makes a changed "
    "output a real signal instead of noise.",
}
VERBS = ["explains", "reminds us", "shows", "notes", "points out"]
UNITS = [
    ("kilometres", "metres", 1000),
    ("hours", "minutes", 60),
    ("kilograms", "grams", 1000),
    ("minutes", "seconds", 60),
    ("litres", "millilitres", 1000),
    ("days", "hours", 24),
]
NAMES = ["Ada", "Bruno", "Chen", "Dara", "Emeka", "Farah", "Goran", "Hana", "Ines", "Jonas"]
ITEMS = ["apples", "pencils", "stamps", "marbles", "books", "tickets", "seeds", "bolts"]


NOTE_ENDINGS = [
    "Instruments were checked at noon.",
    "The anemometer was cleaned.",
    "No faults logged.",
    "Battery voltage was normal.",
]


def weather_note(rng: random.Random, day: int) -> str:
    station = rng.choice(STATIONS)
    low = rng.randint(-5, 12)
    high = low + rng.randint(3, 14)
    rain = rng.choice([0, 0, 0.4, 1.2, 3.5, 7.8])
    return (
        f"Day {day} at {station}: {rng.choice(SKIES)} with {rng.choice(WINDS)}. The temperature ranged from "
        f"{low} to {high} degrees Celsius and {rain} mm of rain was recorded. "
        f"{rng.choice(NOTE_ENDINGS)}"
    )


def topic_note(rng: random.Random) -> str:
    topic, text = rng.choice(sorted(TOPICS.items()))
    who = rng.choice(NAMES)
    return f"On {topic}: {who} {rng.choice(VERBS)} that {text[0].lower()}{text[1:]}"


def arithmetic_pair(rng: random.Random) -> dict[str, str]:
    kind = rng.randrange(4)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if kind == 0:
        a, b = rng.randint(3, 90), rng.randint(2, 60)
        return {
            "prompt": f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?",
            "completion": f"{name} starts with {a} and adds {b}, so {a} + {b} = {a + b}. The answer is {a + b}.",
        }
    if kind == 1:
        a, b = rng.randint(20, 99), rng.randint(1, 19)
        return {
            "prompt": f"There are {a} {item} in a box. {name} takes out {b}. How many are left?",
            "completion": f"{a} - {b} = {a - b}. There are {a - b} {item} left in the box.",
        }
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return {
            "prompt": f"{name} packs {a} bags with {b} {item} each. How many {item} is that in total?",
            "completion": f"{a} bags times {b} {item} is {a} x {b} = {a * b} {item}.",
        }
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 40)
    return {
        "prompt": f"Convert {n} {big} to {small}.",
        "completion": f"One of the {big} is {factor} {small}, so {n} {big} is {n} x {factor} = {n * factor} {small}.",
    }


STATION_TOOL = {
    "name": "get_station_report",
    "description": "The latest report of a weather station",
    "parameters": {"type": "object", "properties": {"station": {"type": "string"}}, "required": ["station"]},
}
SYSTEMS = [
    "You are a concise assistant for a weather network.",
    "Answer with the working shown.",
    "You help field engineers. Keep answers short.",
]


def tool_chat(rng: random.Random, day: int) -> dict:
    station = rng.choice(STATIONS)
    note = f"Day {day} at {station}:" + weather_note(rng, day).split(":", 1)[1]
    return {
        "tools": json.dumps([STATION_TOOL]),
        "conversations": [
            {"from": "human", "value": f"What was the weather at {station} on the last report?"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "get_station_report", "arguments": {"station": station}}),
            },
            {"from": "observation", "value": json.dumps({"station": station, "report": note})},
            {"from": "gpt", "value": f"The last report from {station}: {note.split(': ', 1)[1]}"},
        ],
    }


def arithmetic_chat(rng: random.Random) -> dict:
    turns = [arithmetic_pair(rng) for _ in range(rng.randint(1, 3))]
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.5 else []
    for t in turns:
        messages += [{"role": "user", "content": t["prompt"]}, {"role": "assistant", "content": t["completion"]}]
    return {"messages": messages}


def wrong_answer(pair: dict[str, str]) -> str:
    """The completion with its final number changed: a plausible, wrong answer."""
    words = pair["completion"].rstrip(".").split(" ")
    for i in range(len(words) - 1, -1, -1):
        if words[i].isdigit():
            words[i] = str(int(words[i]) + 1 + len(words[i]))
            break
    return " ".join(words) + "."


def main(data_dir: Path) -> None:
    rng = random.Random(20261121)
    text_raw = data_dir / "raw" / "sample_text"
    inst_raw = data_dir / "raw" / "sample_instruct"
    corpus = data_dir / "corpus"
    for d in (text_raw, inst_raw, corpus):
        d.mkdir(parents=True, exist_ok=True)

    notes = [weather_note(rng, d) if d % 3 else topic_note(rng) for d in range(1, 181)]
    with (text_raw / "field_notes_2026-11-01.jsonl").open("w", encoding="utf-8", newline="\n") as f:
        for i, note in enumerate(notes[:120]):
            f.write(json.dumps({"id": f"note-{i:04d}", "text": note}, ensure_ascii=False) + "\n")
    with (text_raw / "field_notes_2026-11-02.txt").open("w", encoding="utf-8", newline="\n") as f:
        for i, note in enumerate(notes[120:]):
            f.write(note + "\n")
            if i in (10, 40):  # notes the first drop already holds: dropped by the dataset-wide dedup
                f.write(notes[i // 2] + "\n")
        f.write("\n")  # a trailing blank line: counted, never a record

    pairs = [arithmetic_pair(rng) for _ in range(260)]
    with (inst_raw / "arithmetic_2026-11-01.jsonl").open("w", encoding="utf-8", newline="\n") as f:
        for i, pair in enumerate(pairs[:200]):
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
            if i == 41:
                f.write('{"prompt": "What is 2 + 2?", "completion": "4"\n')  # malformed: a bronze reject
            if i == 99:
                f.write(json.dumps(pairs[7], ensure_ascii=False) + "\n")  # exact duplicate: a silver reject
        rest = pairs[200:]
        for j in range(0, len(rest), 3):  # dialogues: a JSON list of turns per line, kept together
            f.write(json.dumps(rest[j : j + 3], ensure_ascii=False) + "\n")

    chat_raw = data_dir / "raw" / "sample_chat"
    chat_raw.mkdir(parents=True, exist_ok=True)
    chats = [tool_chat(rng, d) if d % 4 == 0 else arithmetic_chat(rng) for d in range(1, 121)]
    chats.insert(
        17,
        {
            "messages": [
                {"role": "user", "content": "Is <|im_end|> a token? What about <|im_start|>assistant?"},
                {"role": "assistant", "content": "In your message they are plain text, not tokens."},
            ]
        },
    )
    chats.insert(33, {"conversations": [{"from": "narrator", "value": "Once upon a time."}]})  # unmapped role
    chats.insert(51, {"messages": [{"role": "user", "content": "Convert 3 hours to minutes."}]})  # no assistant turn
    with (chat_raw / "conversations_2026-11-03.jsonl").open("w", encoding="utf-8", newline="\n") as f:
        for chat in chats:
            f.write(json.dumps(chat, ensure_ascii=False) + "\n")

    pref_raw = data_dir / "raw" / "sample_pref"
    pref_raw.mkdir(parents=True, exist_ok=True)
    with (pref_raw / "answer_pairs_2026-11-04.jsonl").open("w", encoding="utf-8", newline="\n") as f:
        for i, pair in enumerate(arithmetic_pair(rng) for _ in range(120)):
            if i % 3 == 0:  # an Anthropic-HH style transcript; the shared prompt is found by comparing branches
                head = f"\n\nHuman: {pair['prompt']}\n\nAssistant:"
                row = {"chosen": f"{head} {pair['completion']}", "rejected": f"{head} {wrong_answer(pair)}"}
            else:
                row = {"prompt": pair["prompt"], "chosen": pair["completion"], "rejected": wrong_answer(pair)}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    (corpus / "chat").mkdir(exist_ok=True)
    with (corpus / "chat" / "chat_corpus.txt").open("w", encoding="utf-8", newline="\n") as f:
        for chat in chats:
            for m in chat.get("messages", chat.get("conversations", [])):
                f.write(m.get("content", m.get("value", "")).replace("\n", " ") + "\n")

    with (corpus / "sample_corpus.txt").open("w", encoding="utf-8", newline="\n") as f:
        for note in notes:
            f.write(note + "\n")
        for pair in pairs:
            f.write(pair["prompt"] + " " + pair["completion"] + "\n")
        for text in TOPICS.values():
            f.write(text + "\n")
    write_sensor_data(data_dir)


def sensor_readings(rng: random.Random, devices: int, hours: int) -> list[dict[str, object]]:
    """Hourly readings of a few sensors: a slow drift plus noise, some humidity missing, status by threshold."""
    rows: list[dict[str, object]] = []
    for d in range(devices):
        site = rng.choice(["north", "south", "east", "west", "roof"])
        base = rng.uniform(12.0, 24.0)
        for h in range(hours):
            temp = round(base + 0.15 * h + rng.gauss(0, 0.6), 1)
            humidity = "" if rng.random() < 0.08 else rng.randint(30, 90)
            status = "alert" if temp > 27 else "warn" if temp > 25 else "ok"
            rows.append(
                {
                    "device_id": f"{site}-{d:02d}",
                    "timestamp": f"2026-11-05T{h:02d}:00",
                    "temp_c": temp,
                    "humidity_pct": humidity,
                    "status": status,
                    "note": "",
                }
            )
    return rows


def write_sensor_data(data_dir: Path) -> None:
    """raw/sample_sensors/: one CSV drop of a tabular time series (sequential by device, ordered by time).

    Within a device the rows are written out of time order (the spec's order_by restores it); a few notes
    hold a quoted newline or a carriage return (escaped in the JSON lines, never breaking a record), some
    humidity cells are empty (missing: null) and one row is ragged (a bronze reject).
    """
    rng = random.Random(20261105)
    rows = sensor_readings(rng, devices=10, hours=24)
    for i in (5, 77, 160):
        rows[i]["note"] = "recalibrated;\nreading after reset"
    rows[120]["note"] = "door open\rclosed at 07:10"
    for d in range(10):  # shuffle each device's hours: the file is not in time order
        block = rows[d * 24 : (d + 1) * 24]
        rng.shuffle(block)
        rows[d * 24 : (d + 1) * 24] = block
    raw = data_dir / "raw" / "sample_sensors"
    raw.mkdir(parents=True, exist_ok=True)
    columns = list(rows[0])
    with (raw / "readings_2026-11-05.csv").open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        quoting = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_ALL)  # QUOTE_MINIMAL leaves a \r bare
        writer.writerow(columns)
        for i, row in enumerate(rows):
            cells = [row[c] for c in columns]
            (quoting if any("\r" in str(v) for v in cells) else writer).writerow(cells)
            if i == 50:
                f.write("east-99,2026-11-05T03:00,21.5\n")  # ragged: 3 of 6 fields, a csv_field_count reject
    # the tokenizer's corpus: other readings as the JSON lines the examples will hold
    corpus = data_dir / "corpus" / "tabular"
    corpus.mkdir(parents=True, exist_ok=True)
    with (corpus / "sensor_corpus.txt").open("w", encoding="utf-8", newline="\n") as f:
        f.write(", ".join(columns) + "\n")
        for row in sensor_readings(random.Random(7), devices=20, hours=24):
            f.write(json.dumps({k: (None if v == "" else v) for k, v in row.items()}, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("data"))
