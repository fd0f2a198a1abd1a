"""Structured output and function calling over the OpenAI front
(docs/STRUCTURED.md): a real `rlai serve` on the default model, spoken to
with the `openai` package and langchain-openai. response_format json_object
and json_schema give JSON that parses and validates (jsonschema); bad
schemas are a 400 naming the keyword; tools give tool_calls (blocking and
streamed, OpenAI's delta shape) with arguments valid under the function's
parameters, and a tool result turn is accepted; LangChain's bind_tools and
with_structured_output work against the served endpoint; the openai
package's parse() with a Pydantic model (numeric bounds, a tuple, formats,
a pattern; addresses and URLs; sets of enum values, durations) gives a
model that Pydantic accepts."""
import json
import re

import pytest

from test_http import Engine, MODEL, RLAI  # noqa: F401  (same fixtures and skips)

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = [
    pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
    pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched (scripts/setup.sh)"),
]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer"},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = Engine(tmp_path_factory.mktemp("structured"))
    yield e
    e.stop()


def chat(engine, **kw):
    kw.setdefault("model", "default")
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 200)
    return engine.client().chat.completions.create(**kw)


def parse_checked(engine, model, prompt, max_tokens=300):
    """openai's parse() with Pydantic model `model`, greedy: the parsed
    object (Pydantic accepted it) and the JSON text's value, which must
    also validate against the model's JSON Schema."""
    r = engine.client().chat.completions.parse(
        model="default", temperature=0, max_tokens=max_tokens, response_format=model,
        messages=[{"role": "user", "content": prompt}])
    obj = r.choices[0].message.parsed
    assert isinstance(obj, model), r.choices[0].message.content
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, model.model_json_schema())
    return obj, value


def test_json_schema_output_validates(engine):
    r = chat(engine, messages=[{"role": "user", "content": "Describe a person called Ann who has a cat."}],
             response_format={"type": "json_schema",
                              "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    obj = json.loads(c.message.content)
    jsonschema.validate(obj, PERSON)


def test_json_object_output_parses_and_streams(engine):
    msgs = [{"role": "user", "content": "Give me a JSON object with a colour and a number."}]
    r = chat(engine, messages=msgs, response_format={"type": "json_object"})
    obj = json.loads(r.choices[0].message.content)
    assert isinstance(obj, dict)
    # the same request streamed gives the same text
    parts = [ch.choices[0].delta.content or "" for ch in
             chat(engine, messages=msgs, response_format={"type": "json_object"}, stream=True) if ch.choices]
    assert "".join(parts) == r.choices[0].message.content


def test_completions_json_schema(engine):
    r = engine.client().completions.create(model="default", prompt="A person as JSON:", temperature=0,
                                           max_tokens=150, extra_body={"response_format": {
                                               "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)


# what Pydantic writes for Field(ge=..., le=..., gt=...): numeric bounds
RATED = {
    "title": "Review",
    "type": "object",
    "properties": {
        "age": {"title": "Age", "type": "integer", "minimum": 18, "maximum": 65},
        "stars": {"title": "Stars", "type": "number", "exclusiveMinimum": 0, "maximum": 5},
        "delta": {"title": "Delta", "type": "integer", "minimum": -3, "exclusiveMaximum": 0},
    },
    "required": ["age", "stars", "delta"],
    "additionalProperties": False,
}


def test_json_schema_numeric_bounds_hold(engine):
    """The prompt asks for values outside the bounds; the output keeps to
    them (jsonschema checks minimum, maximum and the exclusive ones)."""
    r = chat(engine, messages=[{"role": "user", "content":
                                "A review by a 97 year old who gives 9 stars and a delta of 12, as JSON."}],
             response_format={"type": "json_schema",
                              "json_schema": {"name": "review", "schema": RATED, "strict": True}})
    obj = json.loads(r.choices[0].message.content)
    jsonschema.validate(obj, RATED)
    assert 18 <= obj["age"] <= 65 and 0 < obj["stars"] <= 5 and -3 <= obj["delta"] < 0, obj


def test_openai_parse_with_a_pydantic_model(engine):
    """The openai package's parse() with a Pydantic model: Field bounds
    (minimum, maximum, exclusiveMinimum), a tuple (prefixItems), a $ref
    with a description, an Optional (anyOf with null), a date and a UUID
    (format), a pattern. Before 2026-12-07 the schema was a 400
    ('minimum' is not supported), and a format was not kept to. Pydantic
    itself checks the answer."""
    import datetime
    import uuid
    pydantic = pytest.importorskip("pydantic")

    class Stats(pydantic.BaseModel):
        strength: int = pydantic.Field(ge=1, le=20)
        luck: float = pydantic.Field(gt=0, le=1)

    class Npc(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        level: int = pydantic.Field(ge=1, le=60)
        position: tuple[int, int]
        stats: Stats = pydantic.Field(description="core stats")
        title: "str | None" = None
        born: datetime.date
        id: uuid.UUID
        code: str = pydantic.Field(pattern=r"^[A-Z]{3}-\d{4}$")

    Npc.model_rebuild()
    npc, _ = parse_checked(engine, Npc, "Invent a level 99 blacksmith NPC with strength 50 standing at 3, 4.",
                           max_tokens=400)
    assert 1 <= npc.level <= 60 and 1 <= npc.stats.strength <= 20 and 0 < npc.stats.luck <= 1, npc
    assert isinstance(npc.born, datetime.date) and isinstance(npc.id, uuid.UUID)
    assert re.fullmatch(r"[A-Z]{3}-\d{4}", npc.code), npc.code


def test_openai_parse_with_addresses_and_urls(engine):
    """Pydantic's EmailStr, HttpUrl and AnyUrl (format email and uri; HttpUrl
    with maxLength 2083) and a host name: extraction from a text and
    invented details both give a model Pydantic accepts. Before 2026-12-07
    HttpUrl's schema was a 400 ('maxLength' above 1024) and an address was
    any string. HttpUrl's http/https rule is not in its JSON Schema (format
    uri allows mailto: too), so the invented case uses AnyUrl."""
    pydantic = pytest.importorskip("pydantic")
    pytest.importorskip("email_validator")

    class Contact(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=40)
        email: pydantic.EmailStr
        website: pydantic.HttpUrl
        mail_server: str = pydantic.Field(json_schema_extra={"format": "hostname"})

    class Invented(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=40)
        email: pydantic.EmailStr
        homepage: pydantic.AnyUrl
        mail_server: str = pydantic.Field(json_schema_extra={"format": "hostname"})

    assert Contact.model_json_schema()["properties"]["website"]["maxLength"] == 2083
    cases = [(Contact, "Extract the contact from this note: Jane Doe bakes bread in Lyon. Write to "
                       "jane.doe@boulangerie-lyon.fr or see https://boulangerie-lyon.fr/pain?lang=en; "
                       "her mail goes through mx1.boulangerie-lyon.fr."),
             (Contact, "Extract: Red Fox Games, contact press@redfox.games, web https://redfox.games/press, "
                       "mail server mail.redfox.games."),
             (Invented, "Invent the contact details of a harbour master called Peter Hale.")]
    for model, prompt in cases:
        _, text = parse_checked(engine, model, prompt)
        assert re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*", text["mail_server"]), text


def test_openai_parse_with_sets_and_durations(engine):
    """set[Literal[...]] and set[SomeEnum] (uniqueItems over an enum) and
    timedelta (format duration): before 2026-12-07 'uniqueItems' was a 400
    and a duration any string ("two hours" fails Pydantic). Each value of a
    set is written at most once."""
    import datetime
    import enum
    from typing import Literal
    pydantic = pytest.importorskip("pydantic")

    class Trade(enum.Enum):
        SMITHING = "smithing"
        MINING = "mining"
        TRADING = "trading"
        FISHING = "fishing"

    class Npc(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        trades: set[Trade]
        moods: set[Literal["calm", "angry", "sad", "happy"]] = pydantic.Field(min_length=1)
        shift: datetime.timedelta

    for prompt in ("Describe a blacksmith who also mines and works long shifts.",
                   "Describe a fisherman NPC who trades fish and fishes all day, angry and sad."):
        npc, text = parse_checked(engine, Npc, prompt)
        assert len(set(text["trades"])) == len(text["trades"]) and len(set(text["moods"])) == len(text["moods"]), text
        assert npc.moods and isinstance(npc.shift, datetime.timedelta)


def test_openai_parse_with_sets_of_strings(engine):
    """set[str] and frozenset[str] (uniqueItems over strings): a 400 until
    2026-12-07. The first prompt asks for "fire" over and over; the text
    holds each value once (jsonschema checks uniqueItems in parse_checked).
    "runes" are distinct strings of at most 2 characters (maxLength on the
    items). (Unbounded, a 135M model lists "fire-spell-1", "-2", ... to the
    token limit, with or without uniqueItems: the sets here have a
    maxItems.)"""
    pydantic = pytest.importorskip("pydantic")

    class Spell(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=30)
        tags: set[str] = pydantic.Field(max_length=4)
        elements: frozenset[str] = pydantic.Field(min_length=2, max_length=4)
        runes: set[pydantic.constr(max_length=2)] = pydantic.Field(min_length=3, max_length=5)

    class Npc(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        traits: set[str] = pydantic.Field(max_length=5)
        quests: list[str] = pydantic.Field(max_length=3)

    for model, prompt in ((Spell, "Describe a spell tagged fire, fire and fire again, made of fire and fire."),
                          (Npc, "Describe a grumpy innkeeper NPC.")):
        obj, text = parse_checked(engine, model, prompt)
        for k, v in text.items():
            if isinstance(v, list) and k != "quests":
                assert len(set(v)) == len(v), text
        assert isinstance(obj.name, str)


def test_openai_parse_with_ip_addresses_and_leap_days(engine):
    """IPv6Address, IPvAnyAddress and IPvAnyInterface (formats ipv6,
    ipvanyaddress, ipvanyinterface) and a date: before 2026-12-07 an IPv6
    address was any string (Pydantic refused what the model wrote) and a
    date could not be February 29th."""
    import datetime
    import ipaddress
    pydantic = pytest.importorskip("pydantic")

    class Relay(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        address: ipaddress.IPv6Address
        old_address: pydantic.IPvAnyAddress
        gateway: pydantic.IPvAnyInterface
        moved_on: datetime.date

    for prompt in ("Extract: relay 'north-2' moved to 2001:db8::7 on 2024-02-29; it used to be at "
                   "10.0.0.7, behind the gateway 10.0.0.1/24.",
                   "Invent a relay server with an IPv6 address, its old address and its gateway."):
        relay, text = parse_checked(engine, Relay, prompt)
        assert ipaddress.IPv6Address(text["address"]) == relay.address, text
        assert isinstance(relay.moved_on, datetime.date)


def test_openai_parse_with_a_discriminated_union(engine):
    """Field(discriminator=...) over a Union of models: Pydantic writes a
    oneOf with OpenAPI's 'discriminator' beside it, which was a 400 before
    2026-12-07 ("JSON Schema keyword 'discriminator' is not supported")."""
    from typing import Annotated, Literal, Union
    pydantic = pytest.importorskip("pydantic")

    class Attack(pydantic.BaseModel):
        action: Literal["attack"]
        target: str = pydantic.Field(max_length=24)

    class Trade(pydantic.BaseModel):
        action: Literal["trade"]
        item: str = pydantic.Field(max_length=24)
        gold: int = pydantic.Field(ge=0, le=1000)

    class Turn(pydantic.BaseModel):
        speech: str = pydantic.Field(max_length=80)
        act: Annotated[Union[Attack, Trade], pydantic.Field(discriminator="action")]

    assert "discriminator" in json.dumps(Turn.model_json_schema())
    for prompt in ("The merchant offers to sell the player a lantern for 12 gold. Write his turn.",
                   "The goblin attacks the player. Write its turn."):
        turn, text = parse_checked(engine, Turn, prompt)
        assert text["act"]["action"] in ("attack", "trade") and isinstance(turn.act, (Attack, Trade)), text


def test_openai_parse_with_fractional_bounds(engine):
    """Float fields bounded by fractions (confloat(ge=0.1, le=1.9), gt=-2.5):
    before 2026-12-07 a number bound had to be a whole number ("only
    whole-number bounds are"), so such a model was a 400."""
    pydantic = pytest.importorskip("pydantic")

    class Spell(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        cast_time_s: float = pydantic.Field(ge=0.1, le=1.9)
        mana_ratio: float = pydantic.Field(gt=0, lt=0.75)
        luck: float = pydantic.Field(gt=-2.5, le=2.5)

    for prompt in ("Describe a fire spell that takes 1.2 seconds to cast.", "Invent a spell."):
        spell, text = parse_checked(engine, Spell, prompt)
        assert 0.1 <= text["cast_time_s"] <= 1.9 and 0 < text["mana_ratio"] < 0.75, text


def test_openai_parse_with_bounded_dicts(engine):
    """dict fields with min_length / max_length (minProperties /
    maxProperties): before 2026-12-07 a 400 ("JSON Schema keyword
    'minProperties' is not supported")."""
    pydantic = pytest.importorskip("pydantic")

    class Inventory(pydantic.BaseModel):
        owner: str = pydantic.Field(max_length=24)
        items: dict[str, int] = pydantic.Field(min_length=1, max_length=3)

    for prompt in ("The blacksmith owns 3 swords, 2 shields and 10 nails. Give his inventory.",
                   "Invent the inventory of a travelling merchant."):
        inv, text = parse_checked(engine, Inventory, prompt)
        assert 1 <= len(inv.items) <= 3, text


def test_openai_parse_with_patterns_and_lengths(engine):
    """Field(pattern=..., max_length=...) writes both 'pattern' and
    'maxLength', which was a 400 before 2026-12-07 ("'pattern' with
    minLength, maxLength or format is not supported")."""
    import re as re_
    pydantic = pytest.importorskip("pydantic")

    class Ticket(pydantic.BaseModel):
        code: str = pydantic.Field(pattern=r"^[A-Z]{3}-\d{4}$", min_length=8, max_length=8)
        slug: str = pydantic.Field(pattern=r"^[a-z]+(-[a-z]+)*$", max_length=24)
        zone: str = pydantic.Field(pattern=r"^(?P<area>[A-Z])\x2D\d+$", max_length=6)

    for prompt in ("File a ticket for the broken north gate, code GAT-0042.", "Invent a ticket."):
        _, text = parse_checked(engine, Ticket, prompt)
        assert re_.fullmatch(r"[A-Z]{3}-\d{4}", text["code"]) and len(text["slug"]) <= 24, text


def test_openai_parse_with_multiples(engine):
    """Pydantic's multiple_of (multipleOf): a price in cents above 0, a
    quantity in fives, a half-star rating from 1 to 5, a discount in steps
    of 5 percent. Before 2026-12-07 'multipleOf' was a 400. Checked with
    exact decimals: a float check of 12.34 against 0.01 is off by a
    rounding error (python-jsonschema refuses it), Pydantic's has a
    tolerance."""
    from decimal import Decimal
    pydantic = pytest.importorskip("pydantic")

    class Order(pydantic.BaseModel):
        item: str = pydantic.Field(max_length=30)
        unit_price: float = pydantic.Field(gt=0, multiple_of=0.01)
        quantity: int = pydantic.Field(ge=0, multiple_of=5)
        rating: float = pydantic.Field(ge=1, le=5, multiple_of=0.5)
        discount_percent: int = pydantic.Field(ge=0, le=100, multiple_of=5)

    steps = {"unit_price": Decimal("0.01"), "quantity": Decimal(5), "rating": Decimal("0.5"),
             "discount_percent": Decimal(5)}
    for prompt in ("Extract the order: 15 lanterns at 12.34 gold each, rated 4.5 stars, 10% off.",
                   "Invent an order for a potion shop."):
        r = engine.client().chat.completions.parse(
            model="default", temperature=0, max_tokens=200, response_format=Order,
            messages=[{"role": "user", "content": prompt}])
        order = r.choices[0].message.parsed
        assert isinstance(order, Order), r.choices[0].message.content
        exact = json.loads(r.choices[0].message.content, parse_float=Decimal)
        for k, step in steps.items():
            assert Decimal(exact[k]) % step == 0, (k, exact)
        assert exact["unit_price"] > 0 and 1 <= exact["rating"] <= 5 and 0 <= exact["discount_percent"] <= 100


@pytest.mark.parametrize("schema,needle", [
    ({"type": "string", "pattern": "^(?=a)"}, "lookaround"),
    ({"type": "integer", "not": {"const": 3}}, "'not' is not supported"),
    ({"type": "number", "minimum": 1e-40}, "at most 32 fraction digits"),
    ({"type": "integer", "minimum": 3, "maximum": 2}, "no integer"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "more than one constraining schema"),
    ({"type": "wat"}, "unknown JSON Schema type 'wat'"),
    ({"$ref": "#/$defs/none"}, "not found"),
    ({"anyOf": [{"$ref": "#"}, {"type": "string"}]}, "refers back to itself"),   # hung its thread before
])
def test_bad_schema_is_400(engine, schema, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        chat(engine, messages=[{"role": "user", "content": "hi"}],
             response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert needle in str(ei.value)
    assert ei.value.body["param"] == "response_format"
    # the server keeps serving
    assert chat(engine, messages=[{"role": "user", "content": "hi"}], max_tokens=4).choices[0].message.content


def check_call(call):
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    return args


def test_tools_required_blocking_and_tool_turn(engine):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = chat(engine, messages=msgs, tools=[WEATHER], tool_choice="required")
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    assert len(c.message.tool_calls) == 1
    check_call(c.message.tool_calls[0])
    # the call and its result go back; the model answers in text
    call = c.message.tool_calls[0]
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}]
    r2 = chat(engine, messages=msgs, tools=[WEATHER], tool_choice="none", max_tokens=40)
    assert r2.choices[0].finish_reason in ("stop", "length")
    assert r2.choices[0].message.content
    assert not r2.choices[0].message.tool_calls


def test_tool_call_drafts_its_forced_text(engine):
    """A tool call is drafted where the grammar forces its text (keys, the
    function's name) and comes out the same as without drafts
    (docs/SPECULATIVE.md)."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = {mode: chat(engine, messages=msgs, tools=[WEATHER], tool_choice="required", extra_body={"spec": mode})
           for mode in ("off", "ngram")}
    off, on = out["off"].choices[0], out["ngram"].choices[0]
    assert on.finish_reason == off.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in on.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in off.message.tool_calls]
    check_call(on.message.tool_calls[0])
    assert out["off"].usage.completion_tokens_details.accepted_prediction_tokens == 0
    acc = out["ngram"].usage.completion_tokens_details.accepted_prediction_tokens
    assert acc >= 4, out["ngram"].usage   # 9 of 35 here; 1 without the grammar's own drafts


def test_tools_with_n_choices(engine):
    """"n" > 1 with tools: each choice is read for its own call, blocking and
    streamed (tool-call deltas carry their choice's index), and each equals
    the single request with seed + i."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(messages=msgs, tools=[WEATHER], tool_choice="required", temperature=0.9, seed=21)
    r = chat(engine, n=2, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    for i, c in enumerate(r.choices):
        assert c.finish_reason == "tool_calls" and c.message.content is None
        check_call(c.message.tool_calls[0])
        one = chat(engine, **dict(kw, seed=21 + i)).choices[0]
        assert c.message.tool_calls[0].function.arguments == one.message.tool_calls[0].function.arguments
    assert r.choices[0].message.tool_calls[0].id != r.choices[1].message.tool_calls[0].id
    args, names, finish = {0: "", 1: ""}, {0: "", 1: ""}, {}
    for ch in chat(engine, n=2, stream=True, **kw):
        for c in ch.choices:
            for tc in c.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names[c.index] += tc.function.name
                if tc.function and tc.function.arguments:
                    args[c.index] += tc.function.arguments
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    for i in range(2):
        assert names[i] == "get_weather"
        assert args[i] == r.choices[i].message.tool_calls[0].function.arguments
    # tool_choice none with n: every choice is text
    t = chat(engine, n=2, messages=[{"role": "user", "content": "Say hello."}], tools=[WEATHER], tool_choice="none",
             max_tokens=12)
    assert all(c.message.content and not c.message.tool_calls for c in t.choices)


def test_tools_named_streamed_deltas(engine):
    stream = chat(engine, messages=[{"role": "user", "content": "Weather in Oslo, please."}], tools=[WEATHER],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
    name, args, ids, finish = "", "", set(), None
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                ids.add(tc.id)
            if tc.function and tc.function.name:
                name += tc.function.name
            if tc.function and tc.function.arguments:
                args += tc.function.arguments
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert name == "get_weather" and len(ids) == 1
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


def test_tools_auto_gives_text_or_a_valid_call(engine):
    for q in ["What is the weather in Rome?", "Say hello."]:
        r = chat(engine, messages=[{"role": "user", "content": q}], tools=[WEATHER], tool_choice="auto", max_tokens=60)
        c = r.choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            check_call(c.message.tool_calls[0])
        else:
            assert not c.message.content.lstrip().startswith("{")


def test_tools_errors(engine):
    with pytest.raises(openai.BadRequestError) as ei:
        chat(engine, messages=[{"role": "user", "content": "hi"}], tools=[WEATHER],
             tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "'nope'" in str(ei.value)
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "not": {"const": 2}}}}
    with pytest.raises(openai.BadRequestError) as ei:
        chat(engine, messages=[{"role": "user", "content": "hi"}], tools=[bad])
    assert "tools[0].function.parameters" in str(ei.value) and "'not'" in str(ei.value)


def test_more_than_128_tools_is_a_clear_400(engine):
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(129)]
    with pytest.raises(openai.BadRequestError) as ei:
        chat(engine, messages=[{"role": "user", "content": "hi"}], tools=tools)
    assert "at most 128 tools" in str(ei.value) and ei.value.body["param"] == "tools"
    # 128 are taken: here their descriptions overflow this engine's 1000-token
    # prompt limit, which is the refusal then, not the count
    with pytest.raises(openai.BadRequestError) as ei:
        chat(engine, messages=[{"role": "user", "content": "Call f127."}], tools=tools[:128],
             tool_choice={"type": "function", "function": {"name": "f127"}}, max_tokens=24)
    assert ei.value.body["code"] == "context_length_exceeded", ei.value.body


def test_enum_of_300_values_reaches_the_last_ones(engine):
    """Every value of a long enum stays reachable (the matcher kept one head
    per value and dropped those past the 128th): asked for a colour, the
    model picks one of the 100 colours after 200 values it has no reason to
    pick."""
    values = [f"zz-never-{i}" for i in range(200)] + [f"colour {i}" for i in range(100)]
    schema = {"type": "object", "properties": {"pick": {"enum": values}}, "required": ["pick"]}
    r = chat(engine, messages=[{"role": "user", "content": "Pick a colour."}], max_tokens=40,
             response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    pick = json.loads(r.choices[0].message.content)["pick"]
    # the greedy answer is "colour 1" here; before, only "zz-never-0".."zz-never-127" could be written
    assert pick in values[200:], pick


def test_langchain_bind_tools_and_structured_output(engine):
    lc = pytest.importorskip("langchain_openai")
    pydantic = pytest.importorskip("pydantic")
    from langchain_core.tools import tool

    llm = lc.ChatOpenAI(base_url=engine.base + "/v1", api_key=engine.api_key, model="default", temperature=0,
                        max_tokens=150, max_retries=0, timeout=300)

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Berlin?")
    assert len(msg.tool_calls) == 1
    assert msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str)

    class Person(pydantic.BaseModel):
        name: str
        age: int

    # json_schema (response_format) and function calling (tools) methods
    for method in ("json_schema", "function_calling"):
        p = llm.with_structured_output(Person, method=method).invoke("Describe Bob, aged 40.")
        assert isinstance(p, Person), (method, p)
