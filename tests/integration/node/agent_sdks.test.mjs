// The agent APIs through kvroute with their official SDKs: OpenAI's
// `responses.create` and `responses.retrieve` (openai) and Anthropic's `messages.create`
// (@anthropic-ai/sdk), streamed and not, in front of kvroute-mockers; a
// repeated long prefix shows kvroute's prefix routing (x-kvroute-cached-tokens
// and the engine's own cached-token count rise together). Started by
// tests/integration/test_openai_client.py with KVROUTE_URL in the environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const openai = new OpenAI({ baseURL: `${process.env.KVROUTE_URL}/v1`, apiKey: "unused", maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: process.env.KVROUTE_URL, apiKey: "unused", maxRetries: 0 });
const model = "mock-model";
const instructions = "You are a careful travel agent who plans long train journeys through the alps. ".repeat(20);

// Sends `ask(i)` (each time a new suffix after the shared prefix) until kvroute
// reports a cached prefix (the worker's KV events reach it asynchronously),
// for at most 10 s; returns [header value, the engine's cached tokens].
async function cachedAfterRepeats(ask) {
  for (let i = 0; i < 100; i++) {
    const [headers, engineCached] = await ask(i);
    const cached = Number(headers.get("x-kvroute-cached-tokens"));
    if (cached > 0) return [cached, engineCached];
    await new Promise((r) => setTimeout(r, 100));
  }
  return [0, 0];
}

test("responses.create, non-streaming", async () => {
  const { data: r, response } = await openai.responses
    .create({ model, instructions, input: "Plan a trip from Zurich to Milan.", max_output_tokens: 6 })
    .withResponse();
  assert.equal(r.object, "response");
  assert.ok(r.id.startsWith("resp_"));
  assert.ok(r.output_text.length > 0);
  assert.equal(r.usage.output_tokens, 6);
  assert.ok(response.headers.get("x-kvroute-worker"));
  const [cached, engineCached] = await cachedAfterRepeats(async (i) => {
    const { data, response } = await openai.responses
      .create({ model, instructions, input: `Another trip, number ${i}.`, max_output_tokens: 2 })
      .withResponse();
    return [response.headers, data.usage.input_tokens_details.cached_tokens];
  });
  assert.ok(cached > 0, "no repeated prefix found cached");
  assert.ok(engineCached > 0, "the engine reported no cached tokens");
});

test("responses.create, streaming: the event sequence", async () => {
  const { data: stream, response } = await openai.responses
    .create({ model, instructions, input: "Stream a plan.", max_output_tokens: 20, stream: true })
    .withResponse();
  assert.ok(response.headers.get("x-kvroute-cached-tokens") !== null);
  const types = [];
  let text = "";
  let final = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed") final = ev.response;
  }
  assert.equal(types[0], "response.created");
  assert.equal(types.at(-1), "response.completed");
  assert.equal(types.filter((t) => t === "response.output_text.delta").length, 20);
  assert.equal(final.output[0].content[0].text, text);
  assert.equal(final.usage.output_tokens, 20);
});

test("responses.create: previous_response_id continues on the worker that stored it", async () => {
  for (let i = 0; i < 4; i++) {
    const { data: first, response: r1 } = await openai.responses
      .create({ model, input: `Conversation ${i} ${Math.random()}`, max_output_tokens: 2 })
      .withResponse();
    const { data: next, response: r2 } = await openai.responses
      .create({ model, input: `Continue ${Math.random()}`, previous_response_id: first.id, max_output_tokens: 2 })
      .withResponse();
    assert.equal(next.previous_response_id, first.id);
    assert.equal(r2.headers.get("x-kvroute-worker"), r1.headers.get("x-kvroute-worker"));
  }
});

test("responses.retrieve: the worker that stored the response answers; an unknown id is a 404", async () => {
  // kvroute stores nothing: it sends the retrieve to the worker that produced
  // the response (several workers: a wrong one would answer 404).
  for (let i = 0; i < 4; i++) {
    const { data: created, response: r1 } = await openai.responses
      .create({ model, input: `Keep this ${i} ${Math.random()}`, max_output_tokens: 3 })
      .withResponse();
    const { data: got, response: r2 } = await openai.responses.retrieve(created.id).withResponse();
    assert.equal(got.id, created.id);
    assert.equal(got.object, "response");
    assert.deepEqual(got.output, created.output);  // (output_text is added by create() only)
    assert.equal(r2.headers.get("x-kvroute-worker"), r1.headers.get("x-kvroute-worker"));
  }
  await assert.rejects(
    openai.responses.retrieve(`resp_${"0".repeat(32)}`),
    (e) => e instanceof OpenAI.NotFoundError && e.type === "invalid_request_error" && /not found/.test(e.message),
  );
});

test("responses.create: errors as SDK API errors with OpenAI bodies", async () => {
  await assert.rejects(
    openai.responses.create({ model: "no-such-model", input: "x" }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found",
  );
  await assert.rejects(
    openai.responses.create({ model, input: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "input",
  );
});

test("messages.create, non-streaming", async () => {
  const { data: m, response } = await anthropic.messages
    .create({ model, max_tokens: 6, system: instructions, messages: [{ role: "user", content: "Plan a trip." }] })
    .withResponse();
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.equal(m.content[0].type, "text");
  assert.ok(m.content[0].text.length > 0);
  assert.equal(m.stop_reason, "max_tokens");
  assert.equal(m.usage.output_tokens, 6);
  assert.ok(response.headers.get("x-kvroute-worker"));
  const [cached, engineCached] = await cachedAfterRepeats(async (i) => {
    const { data, response } = await anthropic.messages
      .create({ model, max_tokens: 2, system: instructions, messages: [{ role: "user", content: `Trip ${i}.` }] })
      .withResponse();
    return [response.headers, data.usage.cache_read_input_tokens];
  });
  assert.ok(cached > 0, "no repeated prefix found cached");
  assert.ok(engineCached > 0, "the engine reported no cached tokens");
});

test("messages.create, streaming: the event sequence", async () => {
  const { data: stream, response } = await anthropic.messages
    .create({ model, max_tokens: 20, system: instructions, stream: true,
              messages: [{ role: "user", content: "Stream a plan." }] })
    .withResponse();
  assert.ok(response.headers.get("x-kvroute-cached-tokens") !== null);
  const types = [];
  let text = "";
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "content_block_delta") text += ev.delta.text;
  }
  assert.deepEqual(types, ["message_start", "content_block_start", ...Array(20).fill("content_block_delta"),
                           "content_block_stop", "message_delta", "message_stop"]);
  assert.ok(text.length > 0);
});

test("messages.stream: the SDK's helper assembles the final message", async () => {
  const stream = anthropic.messages.stream({ model, max_tokens: 5, messages: [{ role: "user", content: "Hi." }] });
  const m = await stream.finalMessage();
  assert.equal(m.content[0].type, "text");
  assert.equal(m.usage.output_tokens, 5);
  assert.equal(m.stop_reason, "max_tokens");
});

test("messages.create: errors as SDK API errors with Anthropic bodies", async () => {
  await assert.rejects(
    anthropic.messages.create({ model: "no-such-model", max_tokens: 2, messages: [{ role: "user", content: "x" }] }),
    (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === "not_found_error",
  );
  await assert.rejects(
    anthropic.messages.create({ model, max_tokens: 0, messages: [{ role: "user", content: "x" }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === "invalid_request_error",
  );
});
