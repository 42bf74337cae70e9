// The official OpenAI Node SDK against kvroute in front of kvroute-mockers.
// Started by tests/integration/test_openai_client.py, which runs the fleet and
// passes KVROUTE_URL and MOCKER_URLS (comma-separated) in the environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: `${process.env.KVROUTE_URL}/v1`, apiKey: "unused", maxRetries: 0 });
const mockers = process.env.MOCKER_URLS.split(",");
const model = "mock-model";
const system = "You are a patient assistant who explains how caches work in detail. ".repeat(20);

async function cancels() {
  let total = 0;
  for (const m of mockers) total += (await (await fetch(`${m}/mocker/stats`)).json()).cancels_total;
  return total;
}

test("chat completion, non-streaming", async () => {
  const r = await client.chat.completions.create({
    model, max_tokens: 8, messages: [{ role: "system", content: system }, { role: "user", content: "hi" }],
  });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.usage.completion_tokens, 8);
});

test("chat completion, streaming: chunks arrive incrementally", async () => {
  const stream = await client.chat.completions.create({
    model, max_tokens: 200, stream: true,
    messages: [{ role: "system", content: system }, { role: "user", content: "stream" }],
  });
  const times = [];
  let text = "";
  let finish = null;
  for await (const chunk of stream) {
    times.push(performance.now());
    text += chunk.choices[0]?.delta?.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "length");
  assert.ok(times.length >= 200, `only ${times.length} chunks`);
  assert.ok(text.length > 0);
  // Not all at the end: the chunks are spread over the generation time.
  const span = times.at(-1) - times[0];
  const firstHalf = times.filter((t) => t < times[0] + span / 2).length;
  assert.ok(span > 50, `all chunks within ${span} ms`);
  assert.ok(firstHalf > 5 && firstHalf < times.length - 5, `${firstHalf} of ${times.length} in the first half`);
});

test("completions", async () => {
  const r = await client.completions.create({ model, prompt: system + "complete this", max_tokens: 4 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices[0].finish_reason, "length");
  // The worker's KV events reach the router asynchronously: a request sent
  // before they arrive may be routed anywhere. Ask again (each time a new
  // suffix) until one lands on the cached prefix, for at most 10 s.
  let cached = 0;
  for (let i = 0; i < 100 && cached === 0; i++) {
    if (i > 0) await new Promise((r) => setTimeout(r, 100));
    const again = await client.completions.create({ model, prompt: system + `complete that ${i}`, max_tokens: 4 });
    cached = again.usage.prompt_tokens_details.cached_tokens;
  }
  assert.ok(cached > 0, "no later request found the cached prefix");
});

test("an aborted stream is cancelled at the worker", async () => {
  const before = await cancels();
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model, max_tokens: 100000, stream: true, messages: [{ role: "user", content: "a very long answer please" }] },
    { signal: controller.signal },
  );
  let n = 0;
  try {
    for await (const _ of stream) {
      if (++n === 5) controller.abort();
    }
  } catch (e) {
    // The SDK reports the abort as APIUserAbortError (or just ends the stream).
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", String(e));
  }
  assert.ok(n >= 5 && n < 1000, `stream did not stop after the abort (${n} chunks)`);
  let after = before;
  for (let i = 0; i < 100 && after === before; i++) {
    await new Promise((r) => setTimeout(r, 50));
    after = await cancels();
  }
  assert.ok(after > before, "the worker never saw the cancel");
});

test("errors arrive as SDK API errors with OpenAI bodies", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === "model_not_found",
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "messages",
  );
  await assert.rejects(
    client.completions.create({ model }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "prompt",
  );
});

test("models list", async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
});

test("models.retrieve: a served model, and 404 for another", async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, "model");
  await assert.rejects(client.models.retrieve("no-such-model"), (e) => e instanceof OpenAI.NotFoundError);
});

test("embeddings: one vector per input", async () => {
  const r = await client.embeddings.create({ model, input: ["first text", "second text"], encoding_format: "float" });
  assert.equal(r.object, "list");
  assert.deepEqual(r.data.map((d) => d.index), [0, 1]);
  assert.ok(r.data.every((d) => Array.isArray(d.embedding) && d.embedding.length > 0));
});

test("n > 1 and a batch of prompts: every choice", async () => {
  const r = await client.completions.create({ model, prompt: ["one", "two"], n: 2, max_tokens: 2 });
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1, 2, 3]);
});
