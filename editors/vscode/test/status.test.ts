/** The status bar text for the shapes of draftline/status (the live answer is checked in protocol.test). */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { statusView } from '../src/status';

const ready = {
  engine: { state: 'ready', target: 'fake', error: '' },
  answered: 4,
  accepted: 1,
  acceptance_rate: 0.25,
  latency_ms: { count: 4, p50: 12.4, p99: 40 },
  index: { state: 'ready', files: 10 },
};

test('ready: latency p50 and acceptance', () => {
  const view = statusView(ready, true, true);
  assert.equal(view.text, '$(sparkle) draftline 12 ms · 25%');
  assert.match(view.tooltip, /p50 12.4 ms, p99 40 ms over 4 requests/);
  assert.match(view.tooltip, /accepted 1 of 4 answered \(25%\)/);
  assert.equal(view.warning, false);
});

test('indexing progress from the index counters', () => {
  const view = statusView({ ...ready, index: { state: 'building', files: 30, pending: 10 } }, true, true);
  assert.equal(view.text, '$(sparkle) draftline 12 ms · 25% · indexing 75%');
  assert.equal(statusView({ ...ready, index: { state: 'building' } }, true, true).text, '$(sparkle) draftline 12 ms · 25% · indexing');
  assert.equal(statusView({ ...ready, index: { state: 'opening' } }, true, true).text, '$(sparkle) draftline 12 ms · 25% · opening index');
});

test('loading, failed, no model, off, not running', () => {
  assert.equal(statusView({ engine: { state: 'loading', target: 'x' } }, true, true).text, '$(sync~spin) draftline loading');
  const failed = statusView({ engine: { state: 'failed', target: 'x', error: 'OSError: nope' } }, true, true);
  assert.equal(failed.text, '$(error) draftline');
  assert.match(failed.tooltip, /error: OSError: nope/);
  assert.equal(failed.warning, true);
  assert.equal(statusView({ engine: { state: 'empty', target: 'SmolLM2-135M' } }, true, true).text, '$(sync~spin) draftline starting');
  assert.match(statusView({ engine: { state: 'ready', target: 'SmolLM2-135M' } }, true, true).text, /^\$\(sparkle\) draftline /);
  assert.equal(statusView(ready, false, true).text, '$(circle-slash) draftline off');
  assert.equal(statusView(undefined, true, false).warning, true);
  assert.equal(statusView({ ...ready, latency_ms: { count: 0 } }, true, true).text, '$(sparkle) draftline – ms · 25%');
});

test('a degraded monitor rule shows as a warning, with what the server did', () => {
  const monitor = {
    state: 'degraded',
    degraded: ['acceptance', 'identical'],
    rules: { acceptance: { drafter: 'ngram' }, latency: { p99_ms: 80 } },
  };
  const view = statusView({ ...ready, monitor }, true, true);
  assert.equal(view.text, '$(warning) draftline 12 ms · 25% · degraded (acceptance, identical)');
  assert.equal(view.warning, true);
  assert.match(view.tooltip, /degraded: low acceptance, drafting with ngram; output differed from plain decoding, target-only mode/);
  const ok = statusView({ ...ready, monitor: { state: 'ok', degraded: [] } }, true, true);
  assert.equal(ok.text, '$(sparkle) draftline 12 ms · 25%');
  assert.equal(ok.warning, false);
});

test('off: "off", not a "server not running" warning, when no server runs (none is started while off)', () => {
  const off = statusView(undefined, false, false);
  assert.equal(off.text, '$(circle-slash) draftline off');
  assert.equal(off.warning, false);
  assert.match(off.tooltip, /turn them on/);
});

test('while the client starts the server: starting, not a "server not running" warning', () => {
  const starting = statusView(undefined, true, false, true);
  assert.equal(starting.text, '$(sync~spin) draftline starting');
  assert.equal(starting.warning, false);
  assert.equal(statusView(undefined, true, false, false).warning, true); // not running, not starting
});
