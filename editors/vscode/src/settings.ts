/**
 * VS Code settings -> draftline server options: the one mapping (initializationOptions and
 * workspace/didChangeConfiguration carry the same object). Pure: no `vscode` import, so plain
 * Node tests can check it.
 */
import * as path from 'node:path';

/** Every `draftline.*` setting the extension reads, with its default (package.json must agree). */
export const DEFAULTS = {
  'enable': true,
  'languages': { '*': true, 'plaintext': false, 'markdown': false, 'scminput': false } as Record<string, boolean>,
  'server.command': 'draftline',
  'server.args': ['serve'] as string[],
  'server.env': {} as Record<string, string>,
  'model.target': '',
  'model.draft': '',
  'model.options': {} as Record<string, unknown>,
  'completion.mode': null as 'auto' | 'single' | 'multi' | null,
  'completion.debounceMs': null as number | null,
  'completion.maxTokens': null as number | null,
  'completion.maxLinesMulti': null as number | null,
  'index.enabled': null as boolean | null,
  'serverSettings': {} as Record<string, unknown>,
  'status.pollMs': 2000,
  'trace.server': 'off' as 'off' | 'messages' | 'verbose',
};

export type Settings = typeof DEFAULTS;
export type SettingKey = keyof Settings;
export const SETTING_KEYS = Object.keys(DEFAULTS) as SettingKey[];

/** VS Code setting -> path in the server's config (lsp_server/config.py field names, exactly). */
export const SERVER_PATHS: ReadonlyArray<readonly [SettingKey, readonly [string, string]]> = [
  ['model.target', ['model', 'target']],
  ['model.draft', ['model', 'draft']],
  ['model.options', ['model', 'options']],
  ['completion.mode', ['completion', 'mode']],
  ['completion.debounceMs', ['completion', 'debounce_ms']],
  ['completion.maxTokens', ['completion', 'max_tokens']],
  ['completion.maxLinesMulti', ['completion', 'max_lines_multi']],
  ['index.enabled', ['index', 'enabled']],
];

const MODES = new Set(['auto', 'single', 'multi']);

type Json = Record<string, unknown>;

function isObject(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function sameType(value: unknown, fallback: unknown): boolean {
  if (Array.isArray(fallback)) return Array.isArray(value) && value.every((v) => typeof v === 'string');
  if (isObject(fallback)) return isObject(value);
  return typeof value === typeof fallback;
}

/** The shortest status poll interval: package.json's `minimum` only warns in the settings editor. */
export const MIN_POLL_MS = 250;

/**
 * The longest: setInterval's largest delay (2^31-1 ms, ~24.8 days). Node runs a larger delay as 1 ms,
 * so a huge setting would poll draftline/status every millisecond. package.json's `maximum` only warns.
 */
export const MAX_POLL_MS = 2 ** 31 - 1;

/** Read every setting through `get` (e.g. `workspace.getConfiguration('draftline').get`); ill-typed -> default. */
export function readSettings(get: (key: string) => unknown): Settings {
  const out: Json = {};
  for (const key of SETTING_KEYS) {
    const value = get(key);
    const fallback = DEFAULTS[key];
    if (value === undefined) out[key] = fallback;
    else if (fallback === null) out[key] = value; // nullable: checked where it is mapped
    else out[key] = sameType(value, fallback) ? value : fallback;
  }
  const pollMs = out['status.pollMs'] as number;
  out['status.pollMs'] = Number.isFinite(pollMs)
    ? Math.min(MAX_POLL_MS, Math.max(MIN_POLL_MS, pollMs))
    : DEFAULTS['status.pollMs'];
  return out as Settings;
}

/** A value worth sending: unset (null, "", {}) and invalid values are left to the server's other layers. */
function serverValue(key: SettingKey, value: unknown): unknown {
  switch (key) {
    case 'completion.mode':
      return typeof value === 'string' && MODES.has(value) ? value : undefined;
    case 'completion.debounceMs':
      return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : undefined;
    case 'completion.maxTokens':
    case 'completion.maxLinesMulti':
      return typeof value === 'number' && Number.isInteger(value) && value >= 1 ? value : undefined;
    case 'index.enabled':
      return typeof value === 'boolean' ? value : undefined;
    case 'model.options':
      return isObject(value) && Object.keys(value).length > 0 ? value : undefined;
    default:
      return typeof value === 'string' && value.trim() !== '' ? value.trim() : undefined;
  }
}

/**
 * A plain JSON copy. Not structuredClone: VS Code's `getConfiguration().get()` returns its objects as
 * Proxies, which structuredClone refuses (DataCloneError) - that failed activation in a real workbench.
 */
function jsonCopy<T>(value: T): T {
  return value === undefined ? value : JSON.parse(JSON.stringify(value));
}

function deepMerge(into: Json, layer: Json): Json {
  for (const [key, value] of Object.entries(layer)) {
    const current = into[key];
    into[key] = isObject(value) ? deepMerge(isObject(current) ? current : {}, value) : value;
  }
  return into;
}

/**
 * The server options for these settings: `{"draftline": {"model": {...}, "completion": {...}, "index": {...}}}`.
 * `serverSettings` is merged first (any server option, in the server's shape); dedicated settings win.
 */
export function toServerOptions(settings: Settings): { draftline: Json } {
  const section: Json = deepMerge({}, jsonCopy(settings.serverSettings ?? {}));
  for (const [key, [group, field]] of SERVER_PATHS) {
    const value = serverValue(key, settings[key]);
    if (value === undefined) continue;
    const target = isObject(section[group]) ? (section[group] as Json) : (section[group] = {} as Json);
    target[field] = jsonCopy(value);
  }
  return { draftline: section };
}

/** Whether inline completions are wanted for a document of this language. */
export function enabledFor(settings: Settings, languageId: string): boolean {
  if (!settings.enable) return false;
  const languages = settings.languages ?? {};
  if (typeof languages[languageId] === 'boolean') return languages[languageId];
  return languages['*'] !== false;
}

export interface DocumentFilter {
  scheme: string;
  language?: string;
}

/**
 * The documents the server sees: all files, or only the enabled languages when `"*": false`. Notebook
 * cells too: the server declares notebook sync, so the client sends it whole notebooks and a cell's
 * completion sees the notebook's other cells.
 */
export function documentSelector(settings: Settings): DocumentFilter[] {
  const languages = settings.languages ?? {};
  const schemes = ['file', 'untitled', 'vscode-notebook-cell'];
  if (languages['*'] !== false) return schemes.map((scheme) => ({ scheme }));
  const enabled = Object.keys(languages).filter((l) => l !== '*' && languages[l] === true).sort();
  return schemes.flatMap((scheme) => enabled.map((language) => ({ scheme, language })));
}

function leaves(value: unknown, prefix = ''): string[] {
  if (!isObject(value)) return [prefix];
  return Object.entries(value).flatMap(([k, v]) => leaves(v, prefix ? `${prefix}.${k}` : k));
}

/**
 * Whether a settings change needs a server restart rather than didChangeConfiguration: another
 * command / args / env / document set, or a server option that was sent and is now unset (the
 * initializationOptions layer would otherwise keep the old value).
 */
export function needsRestart(started: Settings, now: Settings): boolean {
  const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
  if (!same(started['server.command'], now['server.command'])) return true;
  if (!same(started['server.args'], now['server.args'])) return true;
  if (!same(started['server.env'], now['server.env'])) return true;
  if (!same(documentSelector(started), documentSelector(now))) return true;
  const after = new Set(leaves(toServerOptions(now)));
  return leaves(toServerOptions(started)).some((leaf) => !after.has(leaf));
}

/**
 * How the server process is started: the command, its args, its environment (base env + `server.env`). No cwd: with
 * the workspace as its directory, a `python -m lsp_server` launch would put the workspace first on sys.path, where
 * a project's own `engine/` or `indexer/` package would shadow draftline's.
 */
export interface Launch {
  command: string;
  args: string[];
  env: Record<string, string | undefined>;
}

/** Where the server's paths are resolved: the user's home directory and the (first) workspace folder on disk. */
export interface LaunchPlace {
  home?: string;
  workspaceFolder?: string;
}

/** `~`, `~/...`, `${userHome}` and `${workspaceFolder}` (left as written where there is no such place). */
function expandPath(value: string, place: LaunchPlace): string {
  let out = value;
  if (place.home !== undefined) {
    out = out.replace(/\$\{userHome\}/g, place.home);
    if (out === '~' || out.startsWith('~/') || out.startsWith(`~${path.sep}`)) out = place.home + out.slice(1);
  }
  if (place.workspaceFolder !== undefined) out = out.replace(/\$\{workspaceFolder\}/g, place.workspaceFolder);
  return out;
}

/**
 * The command as spawn() should get it. VS Code expands nothing in settings and spawn() uses no shell, so `~` and
 * `${workspaceFolder}` reached it literally, and a relative path (`.venv/bin/draftline`) resolved against the
 * extension host's directory, not the workspace: each failed with ENOENT. A bare name (`draftline`) stays a PATH
 * lookup; an empty one (a cleared setting) is the default.
 */
function resolveCommand(command: string, place: LaunchPlace): string {
  const trimmed = command.trim();
  if (trimmed === '') return DEFAULTS['server.command'];
  const expanded = expandPath(trimmed, place);
  const isPath = expanded.includes('/') || (path.sep === '\\' && expanded.includes('\\'));
  if (isPath && !path.isAbsolute(expanded) && place.workspaceFolder !== undefined) {
    return path.resolve(place.workspaceFolder, expanded);
  }
  return expanded;
}

export function serverLaunch(
  settings: Settings,
  baseEnv: Record<string, string | undefined>,
  place: LaunchPlace = {},
): Launch {
  const env: Record<string, string | undefined> = { ...baseEnv };
  for (const [name, value] of Object.entries(settings['server.env'])) {
    env[name] = typeof value === 'string' ? expandPath(value, place) : value;
  }
  return {
    command: resolveCommand(settings['server.command'], place),
    args: settings['server.args'].map((arg) => expandPath(arg, place)),
    env,
  };
}

/** What the extension gives vscode-languageclient for these settings (and what the protocol test sends). */
export interface ClientConfig {
  documentSelector: DocumentFilter[];
  initializationOptions: { draftline: Json };
}

export function clientConfig(settings: Settings): ClientConfig {
  return { documentSelector: documentSelector(settings), initializationOptions: toServerOptions(settings) };
}

/** The params of the workspace/didChangeConfiguration push the extension sends when settings change. */
export function didChangeConfigurationParams(settings: Settings): { settings: { draftline: Json } } {
  return { settings: toServerOptions(settings) };
}
