// The Brown corpus (form C, tagged) back to plain text. Its files hold one sentence per line as "word/tag"
// tokens separated by spaces; a paragraph is a run of non-blank lines (its first line indented by a tab) and
// paragraphs are separated by blank lines.
#include <string>
#include <string_view>
#include <vector>

#include "megatrain/data/corpus.h"

namespace mt {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !is_space(s[j])) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

struct Token {
  std::string_view word, tag;
};

Token split_tag(std::string_view tok) {
  size_t slash = tok.rfind('/');
  // A token without a tag (or with an empty word, like a lone "/") is kept whole rather than dropped.
  if (slash == std::string_view::npos || slash == 0) return {tok, {}};
  return {tok.substr(0, slash), tok.substr(slash + 1)};
}

bool is_headline(const std::vector<Token>& line) {
  for (const Token& t : line)
    if (t.tag.find("-hl") == std::string_view::npos) return false;
  return !line.empty();
}

// Joins the words of one paragraph with spaces the way printed text has them.
class Detokenizer {
 public:
  void add(std::string_view w) {
    // This copy of the corpus doubles every ? ! ; (and a few , :), and writes an abbreviation's period again as
    // the sentence's period ("Jr. ."): print one.
    bool doubled = (w == prev_ && (w == "?" || w == "!" || w == ";" || w == "," || w == ":")) ||
                   (w == "." && !prev_.empty() && prev_.back() == '.');
    prev_ = w;
    if (doubled) return;
    // The corpus puts sentence punctuation after a closing quote; American print puts it inside ("city.").
    if (after_close_quote_ && (w == "." || w == "," || w == "?" || w == "!")) {
      out_.insert(out_.size() - 1, w);
      return;
    }
    bool closes, opens;
    std::string_view text = w;
    if (w == "``" || w == "`") {
      text = w == "``" ? "\"" : "'";
      closes = false, opens = true;
    } else if (w == "''") {
      text = "\"";
      closes = true, opens = false;
    } else if (w == "'") {
      // A lone apostrophe is a single quote: alternate opening and closing within the paragraph.
      opens = !single_open_;
      closes = single_open_;
      single_open_ = !single_open_;
    } else if (w == "(" || w == "[" || w == "{") {
      closes = false, opens = true;
    } else {
      closes = is_closing(w);
      opens = false;
    }
    if (!out_.empty() && !closes && !glue_next_) out_ += ' ';
    out_ += text;
    glue_next_ = opens;
    after_close_quote_ = w == "''";
  }
  std::string take() {
    single_open_ = glue_next_ = after_close_quote_ = false;
    prev_ = {};
    return std::move(out_);
  }

 private:
  static bool is_closing(std::string_view w) {
    // Punctuation that attaches to the word before it: , . ; : ! ? ) ] } and runs of them ("?!", "...", "'?'").
    for (char c : w)
      if (std::string_view(",.;:!?)]}'").find(c) == std::string_view::npos) return false;
    return !w.empty();
  }
  std::string out_;
  std::string_view prev_;
  bool glue_next_ = false, single_open_ = false, after_close_quote_ = false;
};

}  // namespace

bool is_brown_file_name(std::string_view name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && name[2] >= '0' && name[2] <= '9' &&
         name[3] >= '0' && name[3] <= '9';
}

std::string brown_to_text(std::string_view tagged) {
  std::vector<std::string> paragraphs;
  Detokenizer para;
  auto end_paragraph = [&] {
    std::string p = para.take();
    if (!p.empty()) paragraphs.push_back(std::move(p));
  };
  size_t pos = 0;
  while (pos <= tagged.size()) {
    size_t nl = tagged.find('\n', pos);
    if (nl == std::string_view::npos) nl = tagged.size();
    std::vector<Token> line;
    for (std::string_view tok : split_ws(tagged.substr(pos, nl - pos))) line.push_back(split_tag(tok));
    pos = nl + 1;
    if (line.empty()) {  // blank line: paragraph break
      end_paragraph();
      continue;
    }
    bool headline = is_headline(line);
    if (headline) end_paragraph();
    for (const Token& t : line) para.add(t.word);
    if (headline) end_paragraph();
  }
  end_paragraph();
  std::string out;
  for (size_t i = 0; i < paragraphs.size(); ++i) {
    if (i) out += "\n\n";
    out += paragraphs[i];
  }
  return out;
}

}  // namespace mt
