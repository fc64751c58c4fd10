;; Batch Emacs + eglot (no company): draftline's textDocument/completion item through
;; `completion-at-point' (what C-M-i runs), against the real server (fake engine).  env: DRAFTLINE_PY,
;; REPO, OUT, SPEC (JSON: lines, crlf, cursor [line col] (1-based line, 0-based column; -1: the line's end), keys (typed
;; there as keystrokes), fake (the fake engine's text)).  Writes one JSON object to OUT.
;; -q (not -Q): Debian's site-start puts elpa-eglot on the load-path.
(require 'json)
(add-to-list 'load-path (expand-file-name "editors/emacs" (getenv "REPO")))
(require 'eglot) (require 'draftline)
(defvar dl-spec (json-parse-string (getenv "SPEC") :object-type 'plist :array-type 'list))
(defvar dl-result nil)
(defun dl-finish ()
  (with-temp-file (getenv "OUT") (insert (json-encode dl-result)))
  (kill-emacs 0))
(setq draftline-command (list (getenv "DRAFTLINE_PY") "-m" "lsp_server" "serve")
      draftline-settings `(:model (:target "fake" :options (:text ,(plist-get dl-spec :fake)))
                           :completion (:debounce_ms 0) :index (:enabled :json-false))
      eglot-server-programs (list (cons draftline-modes (append (list 'draftline-eglot-server) draftline-command))))
(let ((file (expand-file-name "demo.py")) (coding-system-for-write 'no-conversion)
      (eol (if (eq (plist-get dl-spec :crlf) t) "\r\n" "\n")))
  (with-temp-file file (insert (mapconcat #'identity (plist-get dl-spec :lines) eol) eol))
  (find-file file))
(python-mode)
(add-hook 'eglot-managed-mode-hook (lambda () (draftline-inline-mode -1)) t) ; completion at point only
(apply #'eglot (eglot--guess-contact)) ; eglot-ensure waits for a command loop batch never runs
(let ((deadline (+ (float-time) 40)))
  (while (and (not (eglot-current-server)) (< (float-time) deadline)) (accept-process-output nil 0.1)))
(push (cons 'ready (and (eglot-current-server) t)) dl-result)
(unless (eglot-current-server) (dl-finish))
(push (cons 'eol (coding-system-eol-type buffer-file-coding-system)) dl-result) ; 0 unix, 1 dos
(let ((cursor (plist-get dl-spec :cursor)))
  (goto-char (point-min)) (forward-line (1- (car cursor)))
  (if (< (cadr cursor) 0) (end-of-line) (forward-char (cadr cursor))))
(execute-kbd-macro (vconcat (plist-get dl-spec :keys))) ; a vector: a string would read "ö" as M-v
(eglot--signal-textDocument/didChange) ; what eglot's idle timer does after typing
(let* ((capf (eglot-completion-at-point))
       (probe (buffer-substring-no-properties (nth 0 capf) (point))))
  (push (cons 'candidates (vconcat (mapcar #'substring-no-properties (all-completions probe (nth 2 capf)))))
        dl-result))
(let ((completion-auto-help nil)) (call-interactively #'completion-at-point))
(push (cons 'text (buffer-substring-no-properties (point-min) (point-max))) dl-result)
(push (cons 'point_line (buffer-substring-no-properties (line-beginning-position) (point))) dl-result)
(dl-finish)
