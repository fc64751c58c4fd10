-- Helpers for headless Neovim sessions against draftline (tests/editors/test_nvim_sessions.py).
-- A scenario runs as a coroutine: H.wait(cond) yields to Neovim's main loop (typed keys, LSP replies
-- and timers are handled in between) and resumes once cond() is true or its deadline passes.
-- Env: DRAFTLINE_PY, REPO, OUT. Results are key=value lines in OUT (values: one line each).
local H = {}
local out = io.open(os.getenv("OUT"), "w")

function H.w(key, value)
  out:write(key .. "=" .. tostring(value):gsub("\n", "\\n") .. "\n")
  out:flush()
end

function H.finish()
  H.w("done", "true")
  out:close()
  vim.cmd("qa!")
end

-- the plugin from this checkout, the server from this checkout with the fake engine unless overridden
function H.setup(opts)
  vim.opt.rtp:prepend(os.getenv("REPO") .. "/editors/nvim")
  vim.cmd("filetype on")
  opts = opts or {}
  opts.cmd = opts.cmd or { os.getenv("DRAFTLINE_PY"), "-m", "lsp_server", "serve" }
  opts.settings = opts.settings or {
    model = { target = "fake" }, completion = { debounce_ms = 0 }, index = { enabled = false },
  }
  require("draftline").setup(opts)
end

-- polls cond every 20 ms from the main loop; returns cond()'s value, or nil after timeout_ms
function H.wait(cond, timeout_ms)
  local co = coroutine.running()
  local deadline = vim.uv.hrtime() + (timeout_ms or 20000) * 1e6
  local function poll()
    local ok, v = pcall(cond)
    if not ok then return coroutine.resume(co, nil, v) end
    if v then return coroutine.resume(co, v) end
    if vim.uv.hrtime() > deadline then return coroutine.resume(co, nil) end
    vim.defer_fn(poll, 20)
  end
  vim.defer_fn(poll, 0)
  return coroutine.yield()
end

-- yields once to the main loop (typeahead is consumed before timers run)
function H.tick(ms)
  local co = coroutine.running()
  vim.defer_fn(function() coroutine.resume(co) end, ms or 0)
  coroutine.yield()
end

-- types keys (termcodes allowed) as a user would, one key per main-loop turn, ms apart
function H.type(keys, ms)
  for _, k in ipairs(vim.split(keys, "", { plain = true })) do
    vim.api.nvim_feedkeys(k, "t", false)
    H.tick(ms or 10)
  end
end

function H.feed(keys)
  vim.api.nvim_feedkeys(vim.keycode(keys), "t", false)
  H.tick(0)
  H.tick(0)
end

function H.run(fn)
  local co = coroutine.create(function()
    local ok, err = xpcall(fn, debug.traceback)
    if not ok then H.w("error", err) end
    H.finish()
  end)
  vim.schedule(function()
    local ok, err = coroutine.resume(co)
    if not ok then H.w("error", err); H.finish() end
  end)
end

function H.client(buf)
  return vim.lsp.get_clients({ name = "draftline", bufnr = buf or 0 })[1]
end

-- the client attached to buf and its engine ready
function H.ready(buf)
  return H.wait(function()
    local c = H.client(buf)
    if not c or not c.initialized then return false end
    local s = require("draftline").status(buf or 0)
    return s ~= nil and s.engine.state == "ready"
  end, 30000)
end

-- the ghost text shown in buf: first line's virt_text .. "\n" .. each virt_line; "" when none
function H.ghost(buf)
  buf = buf or 0
  local ns = vim.api.nvim_get_namespaces()["nvim.lsp.inline_completion"]
  if not ns then return "" end
  local parts = {}
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })) do
    local s = ""
    for _, chunk in ipairs(m[4].virt_text or {}) do s = s .. chunk[1] end
    table.insert(parts, s)
    for _, vl in ipairs(m[4].virt_lines or {}) do
      local l = ""
      for _, chunk in ipairs(vl) do l = l .. chunk[1] end
      table.insert(parts, l)
    end
  end
  return table.concat(parts, "\n")
end

function H.ghost_pos(buf)
  local ns = vim.api.nvim_get_namespaces()["nvim.lsp.inline_completion"]
  local m = ns and vim.api.nvim_buf_get_extmarks(buf or 0, ns, 0, -1, {})[1]
  return m and (m[2] .. ":" .. m[3]) or ""
end

function H.lines(buf)
  return table.concat(vim.api.nvim_buf_get_lines(buf or 0, 0, -1, false), "\n")
end

function H.status(buf) return require("draftline").status(buf or 0) end

return H
