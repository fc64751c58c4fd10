-- Headless Neovim 0.11 with editors/nvim: draftline's textDocument/completion item in the popup menu
-- (vim.lsp.completion autotrigger, or <C-x><C-o>), chosen with <C-n><C-y>, against the real server
-- (fake engine). env: DRAFTLINE_PY, REPO, OUT, SPEC (JSON: lines, fileformat, cursor {row, col},
-- keys (typed in one burst: "A" or "i" then the word), how ("auto" | "omni"), fake (the fake
-- engine's text), plugin (false: the user's own vim.lsp.config + completion.enable, no editors/nvim)).
-- Writes one JSON object to OUT: what the menu showed and the buffer after choosing the item.
local spec = vim.json.decode(os.getenv("SPEC"))
local result = {}
local function finish()
  local f = io.open(os.getenv("OUT"), "w")
  f:write(vim.json.encode(result))
  f:close()
  vim.cmd("qa!")
end

-- polls cond every 20 ms from the main loop (typeahead and LSP replies are handled in between)
local function wait_for(cond, timeout_ms, k)
  local deadline = vim.uv.hrtime() + timeout_ms * 1e6
  local function poll()
    local ok, v = pcall(cond)
    if ok and v then return k(v) end
    if vim.uv.hrtime() > deadline then return k(nil) end
    vim.defer_fn(poll, 20)
  end
  vim.defer_fn(poll, 0)
end

vim.cmd("filetype on")
local settings = { model = { target = "fake", options = { text = spec.fake } }, completion = { debounce_ms = 0 },
                   index = { enabled = false } }
local cmd = { os.getenv("DRAFTLINE_PY"), "-m", "lsp_server", "serve" }
if spec.plugin == false then
  vim.lsp.config("draftline", { cmd = cmd, filetypes = { "python" }, root_markers = { ".git" },
    init_options = { draftline = settings },
    on_attach = function(client, bufnr)
      vim.bo[bufnr].completeopt = "menuone,noselect"
      vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = true })
    end })
  vim.lsp.enable("draftline")
else
  vim.opt.rtp:prepend(os.getenv("REPO") .. "/editors/nvim")
  require("draftline").setup({ cmd = cmd, settings = settings })
end

local file = vim.fn.getcwd() .. "/demo.py"
local fd = io.open(file, "wb")
local eol = spec.fileformat == "dos" and "\r\n" or "\n"
fd:write(table.concat(spec.lines, eol) .. eol)
fd:close()
vim.cmd("edit " .. file)
result.fileformat = vim.bo.fileformat
local ready = vim.wait(30000, function()
  local c = vim.lsp.get_clients({ name = "draftline", bufnr = 0 })[1]
  return c ~= nil and c.initialized
end, 50)
result.ready = ready
if not ready then return finish() end
vim.api.nvim_win_set_cursor(0, { spec.cursor[1], spec.cursor[2] })

local function draftline_items()
  local info = vim.fn.complete_info({ "pum_visible", "items" })
  if info.pum_visible ~= 1 then return nil end
  local found = {}
  for _, item in ipairs(info.items) do
    if item.menu == "draftline" then table.insert(found, { word = item.word, abbr = item.abbr }) end
  end
  return #found > 0 and found or nil
end

local typed = spec.keys:sub(2) -- what the burst types after the key that enters insert mode
local keys = spec.keys .. (spec.how == "omni" and vim.keycode("<C-x><C-o>") or "")
vim.api.nvim_feedkeys(keys, "nt", false)
-- the whole burst typed and draftline's item in the menu, whichever comes last
local function shown(text, k)
  wait_for(function()
    local line = vim.api.nvim_get_current_line():sub(1, vim.api.nvim_win_get_cursor(0)[2])
    return vim.endswith(line, text) and draftline_items()
  end, 30000, k)
end
local function choose(items)
  result.items = items or {}
  result.typed_line = vim.api.nvim_get_current_line()
  if not items then return finish() end
  vim.api.nvim_feedkeys(vim.keycode("<C-n><C-y><Esc>"), "nt", false)
  wait_for(function() return vim.fn.mode() == "n" end, 5000, function()
    result.lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
    finish()
  end)
end
shown(typed, function(items)
  if not (items and spec.more) then return choose(items) end
  -- typing on while the menu is up (the list is incomplete: the client asks again per key)
  result.first_items = items
  vim.api.nvim_feedkeys(spec.more, "nt", false)
  shown(typed .. spec.more, choose)
end)
