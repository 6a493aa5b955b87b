// End-to-end test of Eddy's web console (server/src/ops/console.html) in headless Chromium,
// against a running eddy and its real HTTP API (no mocks).
//
//   node test.mjs BASE_URL SCREENSHOT_PATH      e.g. node test.mjs http://127.0.0.1:9464 /tmp/console.png
//
// It creates a stream and a metric with a random suffix, watches one card in the page's
// live chart, inserts events, checks the exact SUM the page shows, takes a full-page
// screenshot, and drops the stream. Exits 1 with a message on any failure (60 s at most).
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';

const [base, screenshot] = process.argv.slice(2);
if (!base || !screenshot) {
  console.error('usage: node test.mjs BASE_URL SCREENSHOT_PATH   (BASE_URL: eddy\'s HTTP address, e.g. http://127.0.0.1:9464)');
  process.exit(2);
}
const BASE = base.replace(/\/+$/, '');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const TOTAL_MS = 60_000;
const suffix = randomBytes(4).toString('hex');
const stream = `console_test_${suffix}`;
const metric = `${stream}_by_card`;
const card = `c-${suffix}`;
const otherCard = `other-${suffix}`;
const amounts = [12.5, 7.25, 30];      // SUM = 49.75, exact in binary floating point
const expectedSum = '49.75';

let step = 'starting';
const log = (msg) => console.log(`[console-test] ${msg}`);
const fail = (msg) => { throw new Error(`${step}: ${msg}`); };
const oneLine = (s) => s.replace(/\s+/g, ' ').trim();

async function sql(text) {
  let r;
  try {
    r = await fetch(`${BASE}/api/sql`, { method: 'POST', headers: { 'Content-Type': 'text/plain; charset=utf-8' }, body: text, signal: AbortSignal.timeout(15_000) });
  } catch (e) { fail(`POST /api/sql failed (${e.message}${e.cause ? ': ' + (e.cause.code || e.cause.message) : ''}) for: ${oneLine(text)}`); }
  const body = await r.text();
  let json;
  try { json = JSON.parse(body); } catch { fail(`POST /api/sql answered HTTP ${r.status} with non-JSON: ${body.slice(0, 200)}`); }
  if (!r.ok) {
    const e = json.error || {};
    fail(`POST /api/sql: HTTP ${r.status} ${e.sqlstate} ${e.message}${e.hint ? ` (hint: ${e.hint})` : ''} for: ${oneLine(text)}`);
  }
  return json;
}

// Event time: now, in UTC, as a TIMESTAMP literal. The window is 1 hour of stream time,
// and every event of the test is within seconds of the others, so none leaves it.
const now = () => new Date().toISOString().replace('T', ' ').replace('Z', '');
const lit = (s) => `'${s.replace(/'/g, "''")}'`;
let nextId = 1;
const insert = (key, amount) =>
  sql(`INSERT INTO ${stream} VALUES (${nextId++}, '${now()}', ${lit(key)}, ${amount})`);

const text = (page, sel) => page.locator(sel).textContent({ timeout: 5_000 });
async function waitFor(page, what, fn, arg, timeout = 15_000) {
  step = `waiting for ${what}`;
  try { await page.waitForFunction(fn, arg, { timeout, polling: 100 }); }
  catch (e) { fail(e.name === 'TimeoutError' ? `timed out after ${timeout} ms` : e.message.split('\n')[0]); }
}

async function main() {
  step = `creating stream ${stream}`;
  await sql(`CREATE STREAM ${stream} (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION)
             WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 2)`);
  created = true;
  step = `creating metric ${metric}`;
  await sql(`CREATE METRIC ${metric} AS SELECT card, SUM(amount) AS total, COUNT(*) AS n
             FROM ${stream} WINDOW SLIDING (SIZE 1 HOUR) GROUP BY card`);
  log(`created ${stream} and ${metric}`);

  step = 'launching Chromium';
  profile = mkdtempSync(join(tmpdir(), 'eddy-console-'));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, viewport: { width: 1400, height: 900 },
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  const page = context.pages()[0] || await context.newPage();
  pageRef = page;
  const origin = new URL(BASE).origin;
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('request', (r) => { if (!r.url().startsWith(origin + '/') && !r.url().startsWith('data:')) foreign.push(r.url()); });

  step = `opening ${BASE}/`;
  const response = await page.goto(`${BASE}/`, { timeout: 15_000 });
  if (!response || response.status() !== 200) fail(`GET / answered HTTP ${response && response.status()}`);
  if (!/text\/html/.test(response.headers()['content-type'] || '')) fail(`GET / is ${response.headers()['content-type']}, not text/html`);

  await waitFor(page, `${stream} in #streams`, (name) => document.querySelector('#streams')?.textContent.includes(name), stream);
  step = 'selecting the stream for its DAG';
  await page.locator('#streams button', { hasText: stream }).click({ timeout: 5_000 });
  // Stream, Partitioner, Window, Filter, GroupBy and two Aggregators.
  await waitFor(page, 'the DAG of the stream', (name) => {
    const svg = document.querySelector('#dag svg');
    return svg && svg.textContent.includes(`Stream ${name}`) && svg.querySelectorAll('.node').length >= 7;
  }, stream);
  const dagText = await text(page, '#dag');
  for (const part of ['Window SLIDING', 'GroupBy card', 'SUM(amount)', 'COUNT(*)', metric]) {
    if (!dagText.includes(part)) fail(`the DAG does not show "${part}": ${dagText}`);
  }
  log(`#streams lists ${stream}; #dag has ${await page.locator('#dag svg .node').count()} nodes`);

  step = 'choosing metric, key and column';
  await page.selectOption('#metric-select', metric, { timeout: 10_000 });
  await page.fill('#key-input', card);
  await page.selectOption('#column-select', 'total', { timeout: 10_000 });
  await page.click('#watch-button');
  await waitFor(page, 'the subscription to open', () => document.querySelector('#live-status')?.dataset.state === 'open');
  const countBefore = Number(await text(page, '#live-count'));

  step = 'inserting events';
  for (const a of amounts) await insert(card, a);
  log(`inserted ${amounts.join(', ')} for ${card}`);
  await waitFor(page, `#live-value = ${expectedSum}`, (v) => document.querySelector('#live-value')?.textContent.trim() === v, expectedSum);
  const count = Number(await text(page, '#live-count'));
  if (!(count > countBefore)) fail(`#live-count did not grow (${countBefore} -> ${count})`);
  log(`#live-value = ${expectedSum}, #live-count ${countBefore} -> ${count}`);

  step = 'inserting into another key';
  await insert(otherCard, 1000);
  await page.waitForTimeout(1500);
  const [valueAfter, countAfter] = [await text(page, '#live-value'), Number(await text(page, '#live-count'))];
  if (valueAfter.trim() !== expectedSum) fail(`#live-value changed to ${valueAfter} after an event of another key`);
  if (countAfter !== count) fail(`#live-count changed (${count} -> ${countAfter}) after an event of another key`);
  log('an event of another key left #live-value and #live-count alone');

  step = 'inserting one more event';
  await insert(card, 0.25);
  await waitFor(page, '#live-value = 50', () => document.querySelector('#live-value')?.textContent.trim() === '50');

  await waitFor(page, 'a number in #events-per-second', () => /^[\d,.]+$/.test(document.querySelector('#events-per-second')?.textContent.trim()));
  log(`#events-per-second ${await text(page, '#events-per-second')}, #insert-p99 ${await text(page, '#insert-p99')}`);
  // The data directory's free space and reserve, from /metrics.
  await waitFor(page, 'free space in #disk', () => /MB free of [\d,.]+ MB/.test(document.querySelector('#disk')?.textContent));
  log(`#disk ${await text(page, '#disk')}`);

  step = 'taking the screenshot';
  await page.screenshot({ path: screenshot, fullPage: true });
  log(`screenshot: ${screenshot}`);
  if (pageErrors.length) fail(`JavaScript errors in the page: ${pageErrors.join(' | ')}`);
  if (foreign.length) fail(`the page fetched other origins: ${foreign.join(', ')}`);
}

let context = null, profile = null, pageRef = null, created = false;
const pageErrors = [], consoleErrors = [], foreign = [];

// Closes the browser and drops the stream, whatever happened before; returns the first error.
let cleaned = false;
async function cleanup(failure) {
  if (cleaned) return failure;
  cleaned = true;
  if (failure && pageRef) {
    await pageRef.screenshot({ path: screenshot, fullPage: true, timeout: 5_000 }).catch(() => {});
    for (const id of ['live-status', 'live-value', 'live-count', 'catalog-error']) {
      const t = await pageRef.locator('#' + id).textContent({ timeout: 1000 }).catch(() => null);
      if (t) console.error(`[console-test] #${id}: ${t}`);
    }
  }
  if (context) await context.close().catch(() => {});
  if (profile) rmSync(profile, { recursive: true, force: true });
  if (created) {
    step = `dropping ${stream}`;
    try { await sql(`DROP STREAM ${stream} CASCADE`); log(`dropped ${stream}`); }
    catch (e) { failure = failure || e; }
  }
  return failure;
}
function finish(failure) {
  if (failure) {
    for (const m of consoleErrors) console.error(`[console-test] browser console: ${m}`);
    for (const m of pageErrors) console.error(`[console-test] page error: ${m}`);
    console.error(`[console-test] FAILED: ${failure.message}`);
    process.exit(1);
  }
  log('PASSED');
  process.exit(0);
}
const abort = (why) => {
  const failure = new Error(`${why} (${step})`);
  setTimeout(() => finish(failure), 10_000).unref();  // cleanup gets 10 s at most
  cleanup(failure).then(() => finish(failure));
};
setTimeout(() => abort(`timed out after ${TOTAL_MS / 1000} s`), TOTAL_MS).unref();
process.on('SIGINT', () => abort('interrupted'));
process.on('SIGTERM', () => abort('terminated'));

let failure = null;
try { await main(); } catch (e) { failure = e; }
if (!cleaned) finish(await cleanup(failure));
