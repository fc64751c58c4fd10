-- draftline for Neovim >= 0.11: vim.lsp.config/enable; inline completion on >= 0.12, completion on 0.11.
local M = {}

M.defaults = {
  cmd = { "draftline", "serve" },
  filetypes = { "python", "lua", "javascript", "typescript", "go", "rust", "c", "cpp", "java", "sh" },
  root_markers = { ".draftline.toml", ".git" },
  settings = {}, -- sent as initializationOptions and workspace/didChangeConfiguration ({draftline = ...})
  keys = { accept = "<Tab>", next = "<M-]>", prev = "<M-[>", dismiss = "<C-]>" },
  completion_fallback = true, -- 0.11: vim.lsp.completion.enable(autotrigger) on attach
  -- 0.11 autotrigger asks only on the server's triggerCharacters, and draftline advertises none
  -- (ghost text wants every keystroke): these are added client-side
  fallback_triggers = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.([{,:= ",
}

local function has_inline() return vim.lsp.inline_completion ~= nil end

-- Why the buffer has no draftline client, in words (nil: it has one).
function M.why_not(bufnr)
  if (bufnr or 0) == 0 then bufnr = vim.api.nvim_get_current_buf() end
  if vim.lsp.get_clients({ name = "draftline", bufnr = bufnr })[1] then return nil end
  local opts = M.opts or M.defaults
  local cmd = type(opts.cmd) == "table" and opts.cmd[1]
  if cmd and vim.fn.executable(cmd) == 0 then
    return ("draftline: the server command %q is not found or not executable; set cmd in "
      .. "require('draftline').setup({ cmd = { '/path/to/venv/bin/draftline', 'serve' } })"):format(cmd)
  end
  if not vim.tbl_contains(opts.filetypes or {}, vim.bo[bufnr].filetype) then
    return ("draftline: filetype %q is not in setup()'s filetypes"):format(vim.bo[bufnr].filetype)
  end
  return "draftline: no server attached to this buffer (it failed to start or exited: see :LspInfo and "
    .. vim.lsp.log.get_filename() .. ")"
end

-- draftline/status of the buffer's server; nil and the reason when there is none or it did not answer
function M.status(bufnr)
  local c = vim.lsp.get_clients({ name = "draftline", bufnr = bufnr })[1]
  if not c then return nil, M.why_not(bufnr) end
  local r, err = c:request_sync("draftline/status", vim.NIL, 3000, bufnr or 0)
  if not r or r.err then -- r is nil with no err while the client is stopping
    return nil, "draftline/status: " .. tostring(err or (r and r.err and r.err.message) or "the client is stopping")
  end
  return r.result
end

-- What a key did in this buffer before draftline took it (a completion plugin's <Tab>, the user's own
-- map, else the key itself), kept as a buffer-local <Plug> map: a key with no suggestion to act on
-- falls back to that, not to a bare <Tab>.
local function keep_fallback(bufnr, lhs, name)
  local plug = ("<Plug>(draftline-%s-fallback)"):format(name)
  vim.api.nvim_buf_call(bufnr, function()
    local prev = vim.fn.maparg(lhs, "i", false, true)
    local ours = (prev.desc or ""):find("^draftline: ") ~= nil
    if ours and vim.fn.maparg(plug, "i") ~= "" then return end -- mapped again (another attach): saved already
    if vim.tbl_isempty(prev) or ours then
      vim.keymap.set("i", plug, lhs, { buffer = bufnr, desc = "draftline: fallback" }) -- the key's own meaning
    else
      -- a recursive map whose keys hold its own key (`imap <expr> <Tab> pumvisible() ? "\<C-n>" : "\<Tab>"`)
      -- relied on Vim not mapping an rhs's leading lhs again: under the <Plug> name that <Tab> would reach
      -- draftline's map, which returns the <Plug> again (E223, recursive mapping). Such a map is kept
      -- non-recursive (one that goes to another <Plug> needs remapping and keeps it).
      local rhs = (prev.rhs or ""):lower()
      if prev.noremap == 0 and rhs:find(lhs:lower(), 1, true) and not rhs:find("<plug>", 1, true) then
        prev.noremap = 1
      end
      prev.lhs, prev.lhsraw, prev.lhsrawalt, prev.buffer = plug, vim.keycode(plug), nil, 1
      vim.fn.mapset("i", false, prev)
    end
  end)
  return plug
end

-- The shown item as it stands now. Neovim keeps showing a suggestion while the user types on, its
-- range still where it was requested: accepting it then put the whole text before what was typed
-- ("return a + bre"). Typed text that begins the suggestion is replaced by it; an item the typing
-- departed from, or whose line the cursor left, is stale (nil: nothing is inserted).
function M.fit_item(bufnr, item)
  local r, text = item.range, item.insert_text
  if not r or type(text) ~= "string" or r.start_row ~= r.end_row then return item end
  local win = vim.api.nvim_get_current_win()
  if vim.api.nvim_win_get_buf(win) ~= bufnr then win = vim.fn.bufwinid(bufnr) end
  local cur = vim.api.nvim_win_get_cursor(win)
  local row, col = cur[1] - 1, cur[2]
  if row ~= r.start_row or col < r.start_col then return nil end
  local typed = (vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ""):sub(r.start_col + 1, col)
  if text:sub(1, #typed) ~= typed then return nil end
  if col > r.end_col then item.range = vim.range(bufnr, row, r.start_col, row, col) end
  return item
end

-- Buffer-local: only draftline's buffers lose <Tab> etc. to it.
function M.set_keys(bufnr, k)
  local function map(lhs, rhs, desc, expr)
    if lhs then
      vim.keymap.set("i", lhs, rhs, { buffer = bufnr, expr = expr, replace_keycodes = expr or nil,
                                      remap = expr or nil, desc = desc })
    end
  end
  local fallback = k.accept and keep_fallback(bufnr, k.accept, "accept")
  map(k.accept, function()
    local taken = vim.lsp.inline_completion.get({ bufnr = bufnr, on_accept = function(item)
      item = M.fit_item(bufnr, item)
      if not item then -- nothing valid was shown: the key does what it did before
        vim.api.nvim_feedkeys(vim.keycode(fallback), "m", false)
      end
      return item
    end })
    if not taken then return fallback end
  end, "draftline: accept", true)
  map(k.next, function() vim.lsp.inline_completion.select({ bufnr = bufnr, count = 1 }) end, "draftline: next")
  map(k.prev, function() vim.lsp.inline_completion.select({ bufnr = bufnr, count = -1 }) end, "draftline: previous")
  -- what leaving insert mode does (vim.lsp.inline_completion has no dismiss): the request in flight
  -- cancelled, the suggestion hidden until the next keystroke asks again. Disabling and re-enabling
  -- it instead left that request's answer to a destroyed completer: a Lua error on screen.
  map(k.dismiss, function()
    pcall(vim.api.nvim_exec_autocmds, "InsertLeave",
          { group = ("nvim.lsp.inline_completion:%d"):format(bufnr), buffer = bufnr })
  end, "draftline: dismiss")
end

-- 0.11 inserts only the first word of an item's textEdit ("return" of "return a + b"): a draftline
-- item inserts its whole first line (other servers' items are left alone). A 'fileformat' dos buffer is
-- synced with "\r\n", so the line ends before a "\r" too (else a literal ^M was inserted).
local function fallback_convert(item)
  if item.detail ~= "draftline" or not item.textEdit then return {} end
  return { word = item.textEdit.newText:match("^[^\r\n]*") }
end

-- A suggestion that starts on the next line (`def f():|` + "\n    return 1") has nothing on the cursor's
-- line: its first line is only the word that was typed, and choosing it inserted nothing (while the menu
-- showed "return 1"). It takes the line breaks and its first line of code then (complete() cannot
-- insert a line break itself).
local function fallback_done(bufnr)
  if (vim.v.event or {}).reason ~= "accept" then return end
  local lsp_item = vim.tbl_get(vim.v.completed_item or {}, "user_data", "nvim", "lsp") or {}
  local item, client = lsp_item.completion_item, vim.lsp.get_client_by_id(lsp_item.client_id or -1)
  if not (item and client and item.detail == "draftline" and item.textEdit and item.textEdit.range) then return end
  local text, r = item.textEdit.newText, item.textEdit.range
  local first = text:match("^[^\r\n]*")
  if r.start.line ~= r["end"].line or #first == #text
    or vim.str_utfindex(first, client.offset_encoding or "utf-16") ~= r["end"].character - r.start.character then
    return -- its first line adds text (that line is what is taken), or it is one line
  end
  local lines = vim.split(text, "\r?\n")
  local last = 2
  while last < #lines and not lines[last]:find("%S") do last = last + 1 end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  vim.api.nvim_buf_set_text(bufnr, row - 1, col, row - 1, col, { "", unpack(lines, 2, last) })
  vim.api.nvim_win_set_cursor(0, { row + last - 1, #lines[last] })
end

-- 0.11: draftline's item in the popup menu while typing.
function M.enable_fallback(client, bufnr, opts)
  local provider = client.server_capabilities.completionProvider
  if type(provider) ~= "table" then return end
  -- enable() reads the trigger characters once per client and buffer, so they go in first
  local chars, seen = type(provider.triggerCharacters) == "table" and provider.triggerCharacters or {}, {}
  for _, c in ipairs(chars) do seen[c] = true end
  for c in (opts.fallback_triggers or ""):gmatch(".") do
    if not seen[c] then table.insert(chars, c); seen[c] = true end
  end
  provider.triggerCharacters = chars
  -- the menu shows one item only with menuone; without noselect that item is inserted as soon as it
  -- arrives, in the middle of typing, and <CR> would take it. 'completeopt' is global-local: a buffer
  -- without a local value reads "" with { buf = }, so start from the global value (the user's flags,
  -- e.g. noinsert, popup, fuzzy) unless the buffer already has its own.
  local cot = vim.api.nvim_get_option_value("completeopt", { buf = bufnr })
  if cot == "" then cot = vim.go.completeopt end
  cot = vim.split(cot, ",", { trimempty = true })
  for _, flag in ipairs({ "menuone", "noselect" }) do
    if not vim.tbl_contains(cot, flag) then table.insert(cot, flag) end
  end
  vim.api.nvim_set_option_value("completeopt", table.concat(cot, ","), { buf = bufnr })
  vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = true, convert = fallback_convert })
  local group = vim.api.nvim_create_augroup(("draftline.fallback.%d"):format(bufnr), { clear = true })
  vim.api.nvim_create_autocmd("CompleteDone", { group = group, buffer = bufnr,
                                                callback = function() fallback_done(bufnr) end })
end

function M.setup(opts)
  opts = vim.tbl_deep_extend("force", M.defaults, opts or {})
  M.opts = opts
  local settings = { draftline = opts.settings }
  vim.lsp.config("draftline", {
    cmd = opts.cmd,
    filetypes = opts.filetypes,
    root_markers = opts.root_markers,
    init_options = settings,
    settings = settings,
    on_attach = function(client, bufnr)
      if has_inline() then
        vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
        M.set_keys(bufnr, opts.keys)
      elseif opts.completion_fallback and vim.lsp.completion then
        M.enable_fallback(client, bufnr, opts)
      end
    end,
  })
  vim.lsp.enable("draftline")
  -- vim.lsp.enable skips a config whose command is not executable with only a line in the LSP log:
  -- say so, once, when the first buffer that wants it opens
  local group = vim.api.nvim_create_augroup("draftline.missing", { clear = true })
  vim.api.nvim_create_autocmd("FileType", { group = group, pattern = opts.filetypes, callback = function(ev)
    local cmd = type(opts.cmd) == "table" and opts.cmd[1]
    if cmd and vim.fn.executable(cmd) == 0 and vim.bo[ev.buf].buftype == "" then
      vim.api.nvim_del_augroup_by_id(group)
      vim.schedule(function() vim.notify(M.why_not(ev.buf), vim.log.levels.ERROR) end)
    end
  end })
  vim.api.nvim_create_user_command("DraftlineStatus", function()
    local s, why = M.status(0)
    if s then print(vim.inspect(s)) else vim.notify(why, vim.log.levels.WARN) end
  end, {})
  vim.api.nvim_create_user_command("DraftlineToggle", function()
    if has_inline() then
      local on = vim.lsp.inline_completion.is_enabled({ bufnr = 0 })
      vim.lsp.inline_completion.enable(not on, { bufnr = 0 })
    else
      vim.notify("draftline: :DraftlineToggle needs Neovim 0.12 (vim.lsp.inline_completion)", vim.log.levels.WARN)
    end
  end, {})
end

return M
