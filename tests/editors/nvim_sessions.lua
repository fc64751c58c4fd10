-- Headless Neovim sessions with editors/nvim against the real server (fake engine); env SCENARIO picks
-- one (tests/editors/test_nvim_sessions.py), nvim_lib.lua has the helpers. Keys fed in one
-- nvim_feedkeys call are handled as one burst of typeahead (no timer or LSP reply in between): a fast
-- typist, without depending on how fast this machine is.
local H = dofile(os.getenv("REPO") .. "/tests/editors/nvim_lib.lua")
local S = {}

local function fake(text)
  return { model = { target = "fake", options = { text = text } }, completion = { debounce_ms = 0 },
           index = { enabled = false } }
end

-- demo.py open at "    |" (line 2) in insert mode, the fake's suggestion shown there
local function open_demo(lines)
  vim.fn.writefile(lines or { "def add(a, b):", "    " }, "demo.py")
  vim.cmd("edit demo.py")
  H.w("ready", H.ready())
  vim.api.nvim_win_set_cursor(0, { 2, 4 })
end

local function shown(timeout_ms)
  return H.wait(function() return H.ghost() ~= "" and H.ghost() end, timeout_ms or 20000)
end

local function accepted(n)
  return H.wait(function() local s = H.status(); return s and s.accepted >= n and s.accepted end, 10000)
end

-- A suggestion shown, the user types its first characters and <Tab> before Neovim asks again: the
-- suggestion replaces what was typed (it was inserted before it: "    return a + bre").
S.type_through_accept = function()
  H.setup({ settings = fake("return a + b") })
  open_demo()
  H.feed("A")
  H.w("ghost", shown())
  vim.api.nvim_feedkeys("re" .. vim.keycode("<Tab>"), "t", false)
  H.wait(function() return vim.api.nvim_get_current_line() ~= "    " and H.ghost() == "" end, 5000)
  H.tick(50)
  H.w("line", vim.api.nvim_get_current_line())
  H.w("col", vim.api.nvim_win_get_cursor(0)[2])
  H.w("accepted", accepted(1))
end

-- Typed text that departs from the suggestion: <Tab> inserts no stale suggestion, it is a Tab.
S.stale_accept = function()
  H.setup({ settings = fake("return a + b") })
  open_demo()
  vim.bo.expandtab = false
  H.feed("A")
  H.w("ghost", shown())
  vim.api.nvim_feedkeys("x" .. vim.keycode("<Tab>"), "t", false)
  H.wait(function() return vim.api.nvim_get_current_line() ~= "    x" end, 5000)
  H.tick(50)
  H.w("line", vim.api.nvim_get_current_line())
  H.w("accepted", H.status().accepted)
end

-- The user's own insert-mode <Tab> (a completion plugin's; here an expr map) is what <Tab> does in
-- draftline's buffers whenever no suggestion is shown.
S.user_tab_fallback = function()
  vim.cmd([[inoremap <expr> <Tab> pumvisible() ? "\<C-n>" : "<user-tab>"]])
  H.setup({ settings = fake("return a + b") })
  open_demo()
  H.w("map", vim.fn.maparg("<Tab>", "i", false, true).desc)
  -- one burst: Neovim asks the server only 200 ms after InsertEnter, nothing is shown yet
  vim.api.nvim_feedkeys("A" .. vim.keycode("<Tab>"), "t", false)
  H.wait(function() return vim.api.nvim_get_current_line() ~= "    " end, 5000)
  H.w("line", vim.api.nvim_get_current_line())
  -- the suggestion shown: <Tab> takes it
  H.w("ghost", shown())
  H.feed("<Tab>")
  H.wait(function() return vim.api.nvim_get_current_line():find("return") end, 5000)
  H.w("line2", vim.api.nvim_get_current_line())
  H.w("other_buffer", vim.api.nvim_buf_call(vim.api.nvim_create_buf(true, false), function()
    return vim.fn.maparg("<Tab>", "i")
  end))
end

-- the classic recursive idiom (`imap`, not `inoremap`), whose rhs ends in its own key: with nothing
-- shown, <Tab> inserts a Tab as it did before draftline, not E223 (recursive mapping)
S.recursive_user_tab = function()
  vim.cmd([[imap <expr> <Tab> pumvisible() ? "\<C-n>" : "\<Tab>"]])
  H.setup({ settings = fake("return a + b") })
  open_demo()
  vim.api.nvim_feedkeys("A" .. vim.keycode("<Tab>") .. "x", "t", false)
  H.wait(function() return vim.api.nvim_get_current_line():find("x") end, 5000)
  H.w("line", vim.api.nvim_get_current_line())
  H.w("messages", (vim.fn.execute("messages"):gsub("\n", " ")))
end

-- <C-]> hides what is shown; pressed while a request is in flight, its answer raises no error; the
-- next keystroke asks again. The fake takes 0.1 s a character: its answer comes after the dismiss.
S.dismiss = function()
  local settings = fake("return a + b")
  settings.model.options.step_s = 0.1
  H.setup({ settings = settings })
  open_demo()
  H.feed("A")
  H.w("ghost", shown())
  H.feed("<C-]>")
  H.w("ghost_dismissed", H.ghost())
  local c = H.client()
  local function pending()
    for _, r in pairs(c.requests) do
      if r.type == "pending" and r.method == "textDocument/inlineCompletion" then return true end
    end
    return false
  end
  H.type("x") -- not the suggestion's start: generated anew (its beginning is answered at once)
  H.w("in_flight", H.wait(pending, 10000))
  H.feed("<C-]>")
  H.w("answered", H.wait(function() return next(c.requests) == nil end, 10000))
  H.tick(100)
  H.w("messages", vim.fn.execute("messages"))
  H.type("y")
  H.w("ghost_again", shown())
end

-- The server command is not there: vim.lsp.enable only logs it; the user is told, once, and
-- :DraftlineStatus says why; typing goes on as without the plugin.
S.missing_server = function()
  H.setup({ cmd = { "draftline-no-such-command", "serve" } })
  vim.fn.writefile({ "def add(a, b):", "    " }, "demo.py")
  vim.cmd("edit demo.py")
  H.w("told", H.wait(function() return vim.fn.execute("messages"):find("draftline%-no%-such%-command") ~= nil end, 5000))
  vim.cmd("edit other.py")
  H.tick(100)
  H.w("messages", vim.fn.execute("messages"))
  vim.cmd("messages clear")
  vim.cmd("DraftlineStatus")
  H.w("status", vim.fn.execute("messages"))
  H.feed("ireturn<Tab>x<Esc>")
  H.w("line", vim.api.nvim_get_current_line())
end

-- :DraftlineStatus prints the server's status; :DraftlineToggle turns ghost text off and on.
S.status_toggle = function()
  H.setup({ settings = fake("return a + b") })
  open_demo()
  H.w("status", vim.fn.execute("DraftlineStatus"))
  vim.cmd("DraftlineToggle")
  H.w("enabled", vim.lsp.inline_completion and vim.lsp.inline_completion.is_enabled({ bufnr = 0 }))
  vim.cmd("DraftlineToggle")
  H.w("enabled2", vim.lsp.inline_completion and vim.lsp.inline_completion.is_enabled({ bufnr = 0 }))
  H.w("messages", vim.fn.execute("messages"))
end

local name = os.getenv("SCENARIO")
H.run(function()
  vim.cmd("cd " .. vim.fn.fnameescape(os.getenv("WORKDIR")))
  H.w("scenario", name)
  S[name]()
end)
