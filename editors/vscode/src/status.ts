/**
 * draftline/status (the server's metrics) -> the status bar item's text and tooltip. Pure: no
 * `vscode` import, so plain Node tests can feed it the real server's answer.
 */

export const STATUS_METHOD = 'draftline/status';
/** Params sent all the same: draftline before 2026-12-07 (pygls) answered a request without `params` with -32602. */
export const STATUS_PARAMS = {};

/** The fields of the server's answer that the status bar reads (lsp_server/server.py, Draftline.status). */
export interface ServerStatus {
  engine?: { state?: string; target?: string; error?: string };
  requests?: number;
  answered?: number;
  accepted?: number;
  acceptance_rate?: number;
  latency_ms?: { count?: number; p50?: number; p99?: number };
  index?: { state?: string; files?: number; pending?: number; chunks?: number };
  memory?: { rss_mb?: number };
  /** lsp_server/monitor.py: the live rules; `degraded` names the rules in their degraded state. */
  monitor?: {
    state?: string;
    degraded?: string[];
    rules?: { acceptance?: { drafter?: string }; latency?: { p99_ms?: number | null } };
  };
}

export interface StatusView {
  text: string;
  tooltip: string;
  warning: boolean;
}

const percent = (x: number) => `${Math.round(x * 100)}%`;

function indexText(index: ServerStatus['index']): string {
  // a stored index of a large tree can take tens of seconds to open: completions go on meanwhile,
  // without cross-file context, and the bar says why
  if (index?.state === 'opening') return 'opening index';
  if (!index || index.state !== 'building') return '';
  const files = index.files ?? 0;
  const pending = index.pending ?? 0;
  const total = files + pending;
  return total > 0 && pending > 0 ? `indexing ${percent(files / total)}` : 'indexing';
}

/** One degraded rule and what the server did about it (the actions of lsp_server/monitor.py). */
function ruleText(rule: string, monitor: ServerStatus['monitor']): string {
  const rules = monitor?.rules ?? {};
  switch (rule) {
    case 'latency':
      return `latency p99 ${rules.latency?.p99_ms ?? '?'} ms`;
    case 'acceptance':
      return `low acceptance, drafting with ${rules.acceptance?.drafter ?? 'less'}`;
    case 'memory':
      return 'memory high, KV caches dropped';
    case 'identical':
      return 'output differed from plain decoding, target-only mode';
    default:
      return rule;
  }
}

/**
 * What the status bar shows; `status` is undefined while the server is not running or answering, `starting` while
 * the client starts the server (spawn, initialize).
 */
export function statusView(status: ServerStatus | undefined, enabled: boolean, running: boolean, starting = false): StatusView {
  if (!enabled && (!running || !status)) {
    // off: no server is started for a window that starts with them off
    return { text: '$(circle-slash) draftline off', tooltip: 'draftline: inline completions are off; click to turn them on', warning: false };
  }
  if (starting) {
    return { text: '$(sync~spin) draftline starting', tooltip: 'draftline: starting the server', warning: false };
  }
  if (!running || !status) {
    return { text: '$(circle-slash) draftline', tooltip: 'draftline: server not running (draftline: Restart Server)', warning: true };
  }
  const engine = status.engine ?? {};
  const state = engine.state ?? 'unknown';
  const latency = status.latency_ms ?? {};
  const lines = [
    `draftline — engine ${state}${engine.target ? ` (${engine.target})` : ''}`,
    `latency p50 ${latency.p50 ?? 0} ms, p99 ${latency.p99 ?? 0} ms over ${latency.count ?? 0} requests`,
    `accepted ${status.accepted ?? 0} of ${status.answered ?? 0} answered (${percent(status.acceptance_rate ?? 0)})`,
    `index ${status.index?.state ?? 'none'}${status.index?.files !== undefined ? `, ${status.index.files} files` : ''}`,
  ];
  if (engine.error) lines.push(`error: ${engine.error}`);
  if (status.memory?.rss_mb !== undefined) lines.push(`server memory ${status.memory.rss_mb} MB`);
  const degraded = status.monitor?.state === 'degraded' ? status.monitor.degraded ?? [] : [];
  if (degraded.length) lines.push(`degraded: ${degraded.map((rule) => ruleText(rule, status.monitor)).join('; ')}`);
  lines.push(enabled ? 'Click for details, toggle and restart' : 'Inline completions are off; click to turn them on');
  const tooltip = lines.join('\n');
  const indexing = indexText(status.index);
  if (!enabled) return { text: '$(circle-slash) draftline off', tooltip, warning: false };
  if (state === 'failed') return { text: '$(error) draftline', tooltip, warning: true };
  if (state === 'loading') return { text: '$(sync~spin) draftline loading', tooltip, warning: false };
  if (state === 'empty') return { text: '$(sync~spin) draftline starting', tooltip, warning: false };
  const ms = latency.count ? `${Math.round(latency.p50 ?? 0)} ms` : '– ms';
  const parts = [ms, percent(status.acceptance_rate ?? 0)];
  if (indexing) parts.push(indexing);
  if (degraded.length) {
    parts.push(`degraded (${degraded.join(', ')})`);
    return { text: `$(warning) draftline ${parts.join(' · ')}`, tooltip, warning: true };
  }
  return { text: `$(sparkle) draftline ${parts.join(' · ')}`, tooltip, warning: false };
}
